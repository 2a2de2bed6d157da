#include "ddp/train/metrics.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp::train {
namespace {

// JSON has no NaN or infinity (a diverged loss): those are null, as a missing value is.
std::string number_or_null(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? fmt::format("{:.9g}", *v) : "null";
}

// A field of optional scores, as an optional.
template <class Field>
std::optional<double> field(const std::optional<Scores>& scores, Field get) {
  if (!scores) return std::nullopt;
  return get(*scores);
}

}  // namespace

std::string to_json(const EpochMetrics& m) {
  const auto& v = m.val;
  const auto& t = m.test;
  return fmt::format(
      "{{\"epoch\": {}, \"steps\": {}, \"lr\": {:.9g}, \"train_loss\": {}, \"val_loss\": {}, "
      "\"val_mae\": {}, \"test_loss\": {}, \"test_accuracy\": {}, \"test_mae\": {}, "
      "\"naive_test_loss\": {}, \"naive_test_mae\": {}, \"samples_per_s\": {:.6g}, "
      "\"epoch_seconds\": {:.6g}, \"grad_bytes_per_step\": {:.9g}}}",
      m.epoch, m.steps, m.lr, number_or_null(m.train_loss),
      number_or_null(field(v, [](const Scores& s) { return std::optional(s.loss); })),
      number_or_null(field(v, [](const Scores& s) { return s.mae; })),
      number_or_null(field(t, [](const Scores& s) { return std::optional(s.loss); })),
      number_or_null(field(t, [](const Scores& s) { return s.accuracy; })),
      number_or_null(field(t, [](const Scores& s) { return s.mae; })),
      number_or_null(field(t, [](const Scores& s) { return s.naive_loss; })),
      number_or_null(field(t, [](const Scores& s) { return s.naive_mae; })), m.samples_per_s,
      m.epoch_seconds, m.grad_bytes_per_step);
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

std::string metrics_up_to(const std::string& jsonl, int64_t last_epoch) {
  std::istringstream in(jsonl);
  std::string out, line;
  const std::string field = "{\"epoch\": ";
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) != 0) continue;  // not a line of ours: dropped
    if (std::strtoll(line.c_str() + field.size(), nullptr, 10) <= last_epoch) out += line + "\n";
  }
  return out;
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
