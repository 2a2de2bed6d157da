#pragma once
// Reading what a ddp_train run wrote, for tests: a metrics field, and weights files compared
// bitwise. Header-only: tests that include it link ddp::train and nlohmann_json.

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "ddp/data/time_series.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/state_dict.h"

namespace ddp::testing {

// The number `name` of a metrics JSON line; of the first line where `jsonl` has several. 0 and a
// test failure when the line does not parse or has no such number (null: NaN, a missing score).
inline double metrics_field(const std::string& jsonl, const std::string& name) {
  const std::string line = jsonl.substr(0, jsonl.find('\n'));
  const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  const bool found = record.is_object() && record.contains(name) && record.at(name).is_number();
  EXPECT_TRUE(found) << "no number '" << name << "' in the metrics line " << line;
  return found ? record.at(name).get<double>() : 0.0;
}

// The last line of a run's metrics.jsonl in `dir`.
inline std::string last_metrics(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

// The synthetic series cut to `rows` rows, written to `path`, which it returns: an Informer
// run's evaluation passes cover the validation and test parts whatever its --train-subset, and
// 1,500 rows (enough for 900 training windows of the shipped config) evaluate in a fifth of the
// time that the full 10,000 take.
inline std::string write_short_series(const std::string& path, int64_t rows = 1500) {
  std::ofstream(path) << ddp::data::synthetic_time_series_csv(rows);
  return path;
}

// The two weights files hold the same keys, in order, with bitwise equal tensors.
inline void expect_same_weights(const std::string& a, const std::string& b) {
  const auto wa = ddp::train::state_dict_from(ddp::train::read_pt_file(a), a);
  const auto wb = ddp::train::state_dict_from(ddp::train::read_pt_file(b), b);
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i].first, wb[i].first);
    EXPECT_TRUE(torch::equal(wa[i].second, wb[i].second)) << wa[i].first << " differs";
  }
}

// The two weights files hold the same keys, in order, with tensors within `tolerance` of each other
// (the largest absolute difference).
inline void expect_close_weights(const std::string& a, const std::string& b, double tolerance) {
  const auto wa = ddp::train::state_dict_from(ddp::train::read_pt_file(a), a);
  const auto wb = ddp::train::state_dict_from(ddp::train::read_pt_file(b), b);
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i].first, wb[i].first);
    const auto diff = (wa[i].second.to(torch::kDouble) - wb[i].second.to(torch::kDouble)).abs();
    const double worst = diff.numel() == 0 ? 0.0 : diff.max().item<double>();
    EXPECT_LE(worst, tolerance) << wa[i].first << " differs by " << worst;
  }
}

}  // namespace ddp::testing
