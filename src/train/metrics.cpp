#include "ddp/train/metrics.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp::train {
namespace {

using Json = nlohmann::ordered_json;  // ordered: the keys stay in the order they are set

// A figure to `digits` significant digits, as the file has always held them: equal runs write
// equal lines, and a figure read back compares equal to the rounded one. fmt's "%g" text is a JSON
// number; read as one, it keeps its value and whether it is an integer. JSON has no NaN or
// infinity (a diverged loss): those are null, as a missing value is.
Json figure(const std::optional<double>& v, int digits = 9) {
  if (!v || !std::isfinite(*v)) return nullptr;
  return Json::parse(fmt::format("{:.{}g}", *v, digits));
}

// A field of optional scores, as an optional.
template <class Field>
std::optional<double> field(const std::optional<Scores>& scores, Field get) {
  if (!scores) return std::nullopt;
  return get(*scores);
}

// One change of an --elastic job's group.
Json membership_json(const MembershipRecord& r) {
  Json c;
  c["after_step"] = r.after_step;
  c["why"] = r.why;
  c["lost"] = r.lost;
  c["generation"] = r.generation;
  c["world_before"] = r.world_before;
  c["world_after"] = r.world_after;
  c["recovery_seconds"] = figure(r.recovery_seconds, 6);
  return c;
}

// Rank `rank`'s times summed over `steps` steps, as milliseconds a step.
Json rank_step_ms(size_t rank, const StepTimes& t, int64_t steps) {
  const double per_step_ms = 1000.0 / static_cast<double>(steps);
  Json c;
  c["rank"] = rank;
  c["data"] = figure(t.data_s * per_step_ms, 6);
  c["compute"] = figure(t.compute_s * per_step_ms, 6);
  c["comm"] = figure(t.comm_s * per_step_ms, 6);
  c["optimizer"] = figure(t.optimizer_s * per_step_ms, 6);
  return c;
}

}  // namespace

std::string to_json(const EpochMetrics& m) {
  const auto& v = m.val;
  const auto& t = m.test;
  Json j;
  j["epoch"] = m.epoch;
  j["steps"] = m.steps;
  j["lr"] = figure(m.lr);
  j["train_loss"] = figure(m.train_loss);
  j["val_loss"] = figure(field(v, [](const Scores& s) { return std::optional(s.loss); }));
  j["val_mae"] = figure(field(v, [](const Scores& s) { return s.mae; }));
  j["test_loss"] = figure(field(t, [](const Scores& s) { return std::optional(s.loss); }));
  j["test_accuracy"] = figure(field(t, [](const Scores& s) { return s.accuracy; }));
  j["test_mae"] = figure(field(t, [](const Scores& s) { return s.mae; }));
  j["naive_test_loss"] = figure(field(t, [](const Scores& s) { return s.naive_loss; }));
  j["naive_test_mae"] = figure(field(t, [](const Scores& s) { return s.naive_mae; }));
  j["samples_per_s"] = figure(m.samples_per_s, 6);
  j["epoch_seconds"] = figure(m.epoch_seconds, 6);
  j["grad_bytes_per_step"] = figure(m.grad_bytes_per_step);
  for (const MembershipRecord& r : m.membership_changes) {
    j["membership_changes"].push_back(membership_json(r));
  }
  if (m.rank_times_steps > 0) {
    for (size_t r = 0; r < m.rank_times.size(); ++r) {
      j["rank_step_ms"].push_back(rank_step_ms(r, m.rank_times[r], m.rank_times_steps));
    }
  }
  if (m.straggler) {
    const StragglerVerdict& v = *m.straggler;
    j["straggler"] = {{"rank", v.rank},
                      {"cause", cause_name(v.cause)},
                      {"ratio", figure(v.ratio, 6)},
                      {"rank_ms", figure(v.rank_ms, 6)},
                      {"median_ms", figure(v.median_ms, 6)}};
  }
  // One line: no indent, and a newline in a string is written as \n. A byte that is not UTF-8 (an
  // error message's, in `why`) becomes U+FFFD, as in the flight records and the timeline.
  return j.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

std::string describe(const EpochMetrics& m) {
  std::string out = fmt::format("train loss {:.4f}", m.train_loss);
  for (const auto& [name, scores] : {std::pair{"val", &m.val}, std::pair{"test", &m.test}}) {
    if (!*scores) continue;
    const Scores& s = **scores;
    out += fmt::format(", {} loss {:.4f}", name, s.loss);
    if (s.accuracy) out += fmt::format(", {} accuracy {:.4f}", name, *s.accuracy);
    if (s.mae) out += fmt::format(", {} mae {:.4f}", name, *s.mae);
    if (s.naive_loss && s.naive_mae) {
      out += fmt::format(" (naive forecast: loss {:.4f}, mae {:.4f})", *s.naive_loss, *s.naive_mae);
    }
  }
  return out;
}

std::string records_up_to(const std::string& jsonl, const std::string& key, int64_t last) {
  std::istringstream in(jsonl);
  std::string out, line;
  while (std::getline(in, line)) {
    // Not a line of ours (not an object with an integer `key`; cut short by a crash): dropped.
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) continue;
    const auto value = record.find(key);
    if (value == record.end() || !value->is_number_integer()) continue;
    if (value->get<int64_t>() <= last) out += line + "\n";  // as written, byte for byte
  }
  return out;
}

std::string metrics_up_to(const std::string& jsonl, int64_t last_epoch) {
  return records_up_to(jsonl, "epoch", last_epoch);
}

MetricsWriter::MetricsWriter(std::string path, bool append)
    : path_(std::move(path)), out_(path_, append ? std::ios::app : std::ios::trunc) {
  if (!out_) throw InputError(fmt::format("{}: cannot create the metrics file", path_));
}

void MetricsWriter::write(const EpochMetrics& m) {
  out_ << to_json(m) << '\n';
  out_.flush();
  if (!out_) throw Error(fmt::format("{}: writing the metrics failed", path_));
}

}  // namespace ddp::train
