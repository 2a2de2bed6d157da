#include "ddp/train/metrics.h"

#include <fmt/format.h>

#include <cstdlib>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp::train {
namespace {

std::string number_or_null(const std::optional<double>& v) {
  return v ? fmt::format("{:.9g}", *v) : "null";
}

}  // namespace

std::string to_json(const EpochMetrics& m) {
  return fmt::format(
      "{{\"epoch\": {}, \"steps\": {}, \"lr\": {:.9g}, \"train_loss\": {:.9g}, \"test_loss\": {}, "
      "\"test_accuracy\": {}, \"samples_per_s\": {:.6g}, \"epoch_seconds\": {:.6g}}}",
      m.epoch, m.steps, m.lr, m.train_loss, number_or_null(m.test_loss),
      number_or_null(m.test_accuracy), m.samples_per_s, m.epoch_seconds);
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
