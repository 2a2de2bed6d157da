#include "ddp/comm/diagnose.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "ddp/common/error.h"
#include "ddp/common/files.h"

namespace ddp::comm {
namespace {

namespace fs = std::filesystem;

CollectiveState state_of(const std::string& name, const std::string& file) {
  if (name == "issued") return CollectiveState::kIssued;
  if (name == "done") return CollectiveState::kDone;
  if (name == "failed") return CollectiveState::kFailed;
  throw InputError(fmt::format("{}: unknown collective state '{}'", file, name));
}

std::optional<CollectiveRecord> record_of(const FlightDump& d, uint64_t seq) {
  for (const auto& r : d.collectives) {
    if (r.seq == seq) return r;
  }
  return std::nullopt;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

std::string describe(const CollectiveRecord& r) {
  return fmt::format("#{} {} ({})", r.seq, r.op, r.phase);
}

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

// Ranks that issued the same sequence number as different operations: a collective issued on
// some ranks only (Note [Collective order is identical on all ranks]).
std::optional<std::string> disagreement(const std::vector<FlightDump>& dumps) {
  std::map<uint64_t, std::vector<std::pair<int, const CollectiveRecord*>>> by_seq;
  for (const auto& d : dumps) {
    for (const auto& r : d.collectives) by_seq[r.seq].emplace_back(d.rank, &r);
  }
  for (const auto& [seq, entries] : by_seq) {
    for (const auto& [rank, record] : entries) {
      const auto* first = entries.front().second;
      if (record->op != first->op || record->bytes != first->bytes) {
        return fmt::format(
            "ranks disagree on collective #{}: rank {} issued {} of {} bytes ({}), rank {} {} of "
            "{} bytes ({}); some rank issued a collective the others did not (a collective in a "
            "branch that not every rank takes)",
            seq, entries.front().first, first->op, first->bytes, first->phase, rank, record->op,
            record->bytes, record->phase);
      }
    }
  }
  return std::nullopt;
}

// The ranks that left no record and what is known of their end. Nothing they did can be read:
// every statement about "all ranks" must leave them out and say so.
struct Missing {
  std::vector<int> ranks;
  std::string why;  // "rank 1 ended with signal SIGKILL (9)", or a guess
};

Missing missing_of(const std::vector<FlightDump>& dumps, const RankEnds& ended) {
  const int world = dumps.front().world_size;
  std::vector<bool> seen(static_cast<size_t>(world), false);
  for (const auto& d : dumps) {
    if (d.rank < world) seen[static_cast<size_t>(d.rank)] = true;  // records of another job: no
  }
  Missing missing;
  std::string known;
  size_t unknown = 0;
  for (int r = 0; r < world; ++r) {
    if (seen[static_cast<size_t>(r)]) continue;
    missing.ranks.push_back(r);
    const auto end = ended.find(r);
    if (end == ended.end()) {
      ++unknown;
    } else {
      known += fmt::format("{}rank {} ended with {}", known.empty() ? "" : "; ", r, end->second);
    }
  }
  if (known.empty()) {
    missing.why = "killed before writing one? see their logs";
  } else {
    missing.why = unknown == 0 ? known : known + "; the others: see their logs";
  }
  return missing;
}

// "; no record from rank(s) 1 (rank 1 ended with signal SIGKILL (9)), so whether they entered
// it is unknown", or "" when every rank left a record.
std::string unknown_part(const Missing& missing, const std::string& what) {
  if (missing.ranks.empty()) return "";
  return fmt::format("; no record from rank(s) {} ({}), so whether they entered {} is unknown",
                     ranks_text(missing.ranks), missing.why, what);
}

std::vector<int> ranks_of(const std::vector<FlightDump>& dumps) {
  std::vector<int> ranks;
  for (const auto& d : dumps) ranks.push_back(d.rank);
  return ranks;
}

// One line per rank (its last collective, its phase, why it wrote), then the ranks without a
// record.
std::string rank_summary(const std::vector<FlightDump>& dumps, const Missing& missing) {
  const int world = dumps.front().world_size;
  std::string out = fmt::format("flight records of {} of {} rank(s):\n", dumps.size(), world);
  for (const auto& d : dumps) {
    const auto last = record_of(d, d.last_issued);
    std::string state = "no collective yet";
    if (last) {
      state = fmt::format("last issued {}: {}", describe(*last), to_string(last->state));
      if (last->state == CollectiveState::kIssued) {
        state += fmt::format(", waiting for {:.1f} s", d.time - last->start);
      }
    }
    out += fmt::format("  rank {}: {}; in phase '{}' when written ({})\n", d.rank, state, d.phase,
                       first_line(d.reason));
  }
  if (!missing.ranks.empty()) {
    out +=
        fmt::format("  no record from rank(s) {} ({})\n", ranks_text(missing.ranks), missing.why);
  }
  return out;
}

// Ranks behind the others (last issued before `newest`): the first collective they did not enter.
std::optional<std::string> behind_diagnosis(const std::vector<FlightDump>& dumps, uint64_t newest,
                                            const Missing& missing) {
  std::vector<int> behind, ahead;
  uint64_t first_missing = newest;
  for (const auto& d : dumps) {
    if (d.last_issued < newest) {
      behind.push_back(d.rank);
      first_missing = std::min(first_missing, d.last_issued + 1);
    }
  }
  if (behind.empty()) return std::nullopt;
  std::optional<CollectiveRecord> what;
  for (const auto& d : dumps) {
    if (auto r = record_of(d, first_missing)) {
      what = r;
      ahead.push_back(d.rank);
    }
  }
  std::string phases;
  for (const auto& d : dumps) {
    if (d.last_issued < newest) {
      phases += fmt::format("{}rank {} was in '{}'", phases.empty() ? "" : ", ", d.rank, d.phase);
    }
  }
  const std::string collective = what ? describe(*what) : fmt::format("#{}", first_missing);
  return fmt::format(
      "diagnosis: rank(s) {} did not enter collective {}, which rank(s) {} "
      "entered; {} when the records were written{}\n",
      ranks_text(behind), collective, ranks_text(ahead), phases,
      unknown_part(missing, fmt::format("#{}", first_missing)));
}

// The newest collective, entered in time by every rank with a record: completed or not. Only
// with every rank's record can "every rank" be said; a rank without one may never have entered
// it, and would leave the others waiting just so.
std::string settled_diagnosis(const std::vector<FlightDump>& dumps, const CollectiveRecord& what,
                              bool all_done, const Missing& missing) {
  if (missing.ranks.empty()) {
    if (all_done) {
      return fmt::format("diagnosis: no rank lags: every rank completed collective {}\n",
                         describe(what));
    }
    return fmt::format(
        "diagnosis: every rank entered collective {} and it did not complete: a "
        "network or backend problem, or a rank stuck inside it\n",
        describe(what));
  }
  const std::string with =
      fmt::format("every rank with a record ({})", ranks_text(ranks_of(dumps)));
  const std::string unknown = unknown_part(missing, fmt::format("#{}", what.seq));
  if (all_done) {
    return fmt::format("diagnosis: no rank with a record lags: {} completed collective {}{}\n",
                       with, describe(what), unknown);
  }
  return fmt::format(
      "diagnosis: {} entered collective {} and it did not complete{}: a rank that ended or "
      "stopped before entering it leaves the others waiting just so\n",
      with, describe(what), unknown);
}

// Every rank with a record entered the newest collective: did some enter it only after others
// gave up?
std::string newest_diagnosis(const std::vector<FlightDump>& dumps, uint64_t newest,
                             const Missing& missing) {
  double first_start = 0.0, first_failure = 0.0;
  for (const auto& d : dumps) {
    if (auto r = record_of(d, newest)) {
      if (first_start == 0.0 || r->start < first_start) first_start = r->start;
      if (r->state == CollectiveState::kFailed && (first_failure == 0.0 || r->end < first_failure))
        first_failure = r->end;
    }
  }
  std::vector<int> late;
  std::optional<CollectiveRecord> what;
  bool all_done = true;
  for (const auto& d : dumps) {
    auto r = record_of(d, newest);
    if (!r) continue;
    what = r;
    all_done = all_done && r->state == CollectiveState::kDone;
    if (first_failure > 0.0 && r->start > first_failure) late.push_back(d.rank);
  }
  if (!what) return "diagnosis: no collective was recorded\n";
  if (!late.empty()) {
    return fmt::format(
        "diagnosis: rank(s) {} entered collective {} only after another rank had "
        "given up on it ({:.1f} s after the first rank entered it): rank(s) {} "
        "lagged{}\n",
        ranks_text(late), describe(*what), first_failure - first_start, ranks_text(late),
        unknown_part(missing, fmt::format("#{}", newest)));
  }
  return settled_diagnosis(dumps, *what, all_done, missing);
}

}  // namespace

FlightDump parse_flight_dump(const std::string& text, const std::string& file) {
  try {
    const YAML::Node root = YAML::Load(text);
    FlightDump d;
    d.file = file;
    d.rank = root["rank"].as<int>();
    d.world_size = root["world_size"].as<int>();
    d.reason = root["reason"].as<std::string>();
    d.time = root["time"].as<double>();
    d.phase = root["phase"].as<std::string>();
    d.last_issued = root["last_issued"].as<uint64_t>();
    for (const auto& c : root["collectives"]) {
      CollectiveRecord r;
      r.seq = c["seq"].as<uint64_t>();
      r.op = c["op"].as<std::string>();
      r.phase = c["phase"].as<std::string>();
      r.bytes = c["bytes"].as<int64_t>();
      r.start = c["start"].as<double>();
      r.end = c["end"].as<double>();
      r.state = state_of(c["state"].as<std::string>(), file);
      d.collectives.push_back(std::move(r));
    }
    if (d.rank < 0 || d.rank >= d.world_size) {
      throw InputError(
          fmt::format("{}: rank {} outside world size {}", file, d.rank, d.world_size));
    }
    return d;
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: not a flight record: {}", file, e.what()));
  }
}

std::vector<FlightDump> read_flight_dumps(const std::string& dir) {
  fs::path where = fs::path(dir) / "debug";
  if (!fs::is_directory(where)) where = dir;
  std::vector<FlightDump> dumps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(where, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank", 0) == 0 && entry.path().extension() == ".json") {
      dumps.push_back(parse_flight_dump(read_file(entry.path().string()), entry.path().string()));
    }
  }
  if (ec || dumps.empty()) {
    throw InputError(
        fmt::format("{}: no flight records (rank<r>.json) in it or in its debug/", dir));
  }
  std::sort(dumps.begin(), dumps.end(),
            [](const FlightDump& a, const FlightDump& b) { return a.rank < b.rank; });
  return dumps;
}

std::string diagnose(const std::vector<FlightDump>& dumps, const RankEnds& ended) {
  DDP_CHECK(!dumps.empty(), "diagnose needs at least one flight record");
  const Missing missing = missing_of(dumps, ended);
  const std::string out = rank_summary(dumps, missing);
  if (auto disagree = disagreement(dumps)) return out + "diagnosis: " + *disagree + "\n";
  uint64_t newest = 0;
  for (const auto& d : dumps) newest = std::max(newest, d.last_issued);
  if (auto behind = behind_diagnosis(dumps, newest, missing)) return out + *behind;
  return out + newest_diagnosis(dumps, newest, missing);
}

}  // namespace ddp::comm
