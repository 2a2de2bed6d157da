#include "ddp/comm/diagnostics/diagnose.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <type_traits>

#include "ddp/common/error.h"
#include "ddp/common/files.h"

namespace ddp::comm {
namespace {

namespace fs = std::filesystem;

using nlohmann::json;

[[noreturn]] void not_a_record(const std::string& file, const std::string& why) {
  throw InputError(fmt::format("{}: not a flight record: {}", file, why));
}

// The text after nlohmann's "[json.exception.parse_error.101] ", which names the library, not
// the problem: "parse error at line 3, column 5: syntax error while parsing ...".
std::string without_exception_id(const std::string& what) {
  const size_t end = what.find("] ");
  return what.rfind("[json.", 0) == 0 && end != std::string::npos ? what.substr(end + 2) : what;
}

// A value as an error message shows it: scalars as written, shortened; objects and arrays by type.
std::string shown(const json& v) {
  if (!v.is_primitive()) return v.type_name();
  const std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() <= 40 ? text : text.substr(0, 37) + "...";
}

// Whether an integer of the record fits the field's type: a negative seq or a rank past int's range
// is an error, not a wrapped number.
template <class Int>
bool fits(uint64_t u) {
  if constexpr (std::is_unsigned_v<Int> && sizeof(Int) >= sizeof(uint64_t)) {
    return true;
  } else {
    return u <= static_cast<uint64_t>(std::numeric_limits<Int>::max());
  }
}

template <class Int>
bool fits(int64_t i) {
  if constexpr (std::is_unsigned_v<Int>) {
    return i >= 0;
  } else {
    return i >= static_cast<int64_t>(std::numeric_limits<Int>::min());
  }
}

// The fields of one object of a flight record, read with the type the writer gave them; every
// error names the file and the field ("collectives[2].seq").
class Fields {
 public:
  // `where`: the object's path in the record, "" for the record itself.
  Fields(const json& object, std::string where, const std::string& file)
      : object_(object), where_(std::move(where)), file_(file) {
    if (!object_.is_object()) {
      not_a_record(file_, fmt::format("{} is {}, not an object",
                                      where_.empty() ? "the top level" : where_, shown(object_)));
    }
  }

  const json& at(const char* key) const {
    const auto it = object_.find(key);
    if (it == object_.end()) {
      not_a_record(file_, where_.empty() ? fmt::format("no key '{}'", key)
                                         : fmt::format("{} has no key '{}'", where_, key));
    }
    return *it;
  }

  std::string text(const char* key) const {
    const json& v = at(key);
    if (!v.is_string()) fail(key, "a string", v);
    return v.get<std::string>();
  }

  double number(const char* key) const {
    const json& v = at(key);
    if (!v.is_number()) fail(key, "a number", v);
    return v.get<double>();
  }

  // An integer that fits Int.
  template <class Int>
  Int integer(const char* key) const {
    const json& v = at(key);
    // nlohmann holds an integer >= 0 as unsigned, a negative one as signed.
    if (v.is_number_unsigned() && fits<Int>(v.get<uint64_t>())) return v.get<Int>();
    if (v.is_number_integer() && !v.is_number_unsigned() && fits<Int>(v.get<int64_t>())) {
      return v.get<Int>();
    }
    fail(key,
         fmt::format("an integer from {} to {}", std::numeric_limits<Int>::min(),
                     std::numeric_limits<Int>::max()),
         v);
  }

 private:
  [[noreturn]] void fail(const char* key, const std::string& expected, const json& v) const {
    not_a_record(file_, fmt::format("{}{}{}: expected {}, got {}", where_,
                                    where_.empty() ? "" : ".", key, expected, shown(v)));
  }

  const json& object_;
  std::string where_;
  const std::string& file_;
};

CollectiveState state_of(const std::string& name, const std::string& file) {
  if (name == "issued") return CollectiveState::kIssued;
  if (name == "done") return CollectiveState::kDone;
  if (name == "failed") return CollectiveState::kFailed;
  throw InputError(fmt::format("{}: unknown collective state '{}'", file, name));
}

CollectiveRecord collective_of(const json& c, size_t index, const std::string& file) {
  const Fields f(c, fmt::format("collectives[{}]", index), file);
  CollectiveRecord r;
  r.seq = f.integer<uint64_t>("seq");
  r.op = f.text("op");
  r.phase = f.text("phase");
  r.bytes = f.integer<int64_t>("bytes");
  r.start = f.number("start");
  r.end = f.number("end");
  r.state = state_of(f.text("state"), file);
  return r;
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
// "ns::f(int, std::string const&) const" -> "ns::f": the summary names the function short (the
// stacks file has it whole).
std::string without_parameters(std::string name) {
  for (const std::string qualifier : {" const", " &&", " &"}) {
    if (name.size() > qualifier.size() &&
        name.compare(name.size() - qualifier.size(), qualifier.size(), qualifier) == 0) {
      name.resize(name.size() - qualifier.size());
    }
  }
  if (name.empty() || name.back() != ')') return name;
  int depth = 0;
  for (size_t i = name.size(); i-- > 0;) {
    if (name[i] == ')') ++depth;
    if (name[i] == '(' && --depth == 0) return i == 0 ? name : name.substr(0, i);
  }
  return name;
}

// "    rank 2 was in train.cpp:57 (my_eval); every thread's stack: DIR/rank2.stacks.txt"
std::string waiting_in_line(int rank, const WaitingIn& w) {
  std::string where = w.function.empty() ? "code without a symbol" : without_parameters(w.function);
  if (!w.file.empty()) {
    where = fmt::format("{}:{} ({})", fs::path(w.file).filename().string(), w.line, where);
  }
  return fmt::format("    rank {} was in {}; every thread's stack: {}\n", rank, where,
                     w.stacks_file);
}

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
    if (d.waiting_in) out += waiting_in_line(d.rank, *d.waiting_in);
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
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    // A syntax error (parse_error) names the line and column; a number past double's range is an
    // out_of_range.
    not_a_record(file, without_exception_id(e.what()));
  }
  const Fields f(root, "", file);
  FlightDump d;
  d.file = file;
  d.rank = f.integer<int>("rank");
  d.world_size = f.integer<int>("world_size");
  d.reason = f.text("reason");
  d.time = f.number("time");
  d.phase = f.text("phase");
  d.last_issued = f.integer<uint64_t>("last_issued");
  const json& collectives = f.at("collectives");
  if (!collectives.is_array()) {
    not_a_record(file, fmt::format("collectives is {}, not an array", shown(collectives)));
  }
  for (size_t i = 0; i < collectives.size(); ++i) {
    d.collectives.push_back(collective_of(collectives[i], i, file));
  }
  if (root.contains("waiting_in")) {  // records written without stacks have none
    const Fields w(root["waiting_in"], "waiting_in", file);
    d.waiting_in = WaitingIn{w.text("function"), w.text("file"), w.integer<int>("line"),
                             w.text("stacks_file")};
  }
  if (root.contains("straggler")) d.straggler = f.text("straggler");  // where one was named
  if (d.rank < 0 || d.rank >= d.world_size) {
    throw InputError(fmt::format("{}: rank {} outside world size {}", file, d.rank, d.world_size));
  }
  return d;
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

namespace {

// The newest record's straggler line ("" where none was named): a rank that was slowing before
// the stall, as rank 0 had seen it over the last window of steps (every rank keeps the verdict).
std::string slowing_before(const std::vector<FlightDump>& dumps) {
  const FlightDump* newest = nullptr;
  for (const auto& d : dumps) {
    if (!d.straggler.empty() && (newest == nullptr || d.time > newest->time)) newest = &d;
  }
  return newest == nullptr ? "" : "before the stall, " + newest->straggler + "\n";
}

}  // namespace

std::string diagnose(const std::vector<FlightDump>& dumps, const RankEnds& ended) {
  DDP_CHECK(!dumps.empty(), "diagnose needs at least one flight record");
  const Missing missing = missing_of(dumps, ended);
  const std::string out = rank_summary(dumps, missing);
  const std::string slowing = slowing_before(dumps);
  if (auto disagree = disagreement(dumps)) return out + "diagnosis: " + *disagree + "\n" + slowing;
  uint64_t newest = 0;
  for (const auto& d : dumps) newest = std::max(newest, d.last_issued);
  if (auto behind = behind_diagnosis(dumps, newest, missing)) return out + *behind + slowing;
  return out + newest_diagnosis(dumps, newest, missing) + slowing;
}

}  // namespace ddp::comm
