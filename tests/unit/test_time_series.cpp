// The time-series CSV reader: Informer's split, scaling and windows, and each kind of bad file.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "ddp/common/error.h"
#include "ddp/data/time_series.h"
#include "subprocess.h"

namespace {

using ddp::data::TimeSeriesOptions;

// `rows` hourly rows from 2021-01-01 00:00:00 (a Friday): date, a, b, OT.
std::string hourly_csv(int rows) {
  std::ostringstream out;
  out << "date,a,b,OT\n";
  for (int r = 0; r < rows; ++r) {
    const int day = 1 + r / 24, hour = r % 24;
    out << fmt::format("2021-01-{:02d} {:02d}:00:00,{},{},{}\n", day, hour, r, 2.0 * r + 1,
                       std::sin(r * 0.1));
  }
  return out.str();
}

TimeSeriesOptions small() {
  TimeSeriesOptions o;
  o.seq_len = 24;
  o.label_len = 12;
  o.pred_len = 6;
  return o;
}

std::string csv_error_of(const std::string& csv, TimeSeriesOptions o = small()) {
  ddp::testing::TempDir dir;
  ddp::testing::write_file(dir.file("d.csv"), csv);
  try {
    ddp::data::load_time_series(dir.file("d.csv"), o);
  } catch (const ddp::InputError& e) {
    std::string what = e.what();
    return what.substr(what.find("d.csv"));
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

TEST(TimeSeries, SplitsScalesAndWindowsAsInformer) {
  ddp::testing::TempDir dir;
  ddp::testing::write_file(dir.file("d.csv"), hourly_csv(200));
  const auto d = ddp::data::load_time_series(dir.file("d.csv"), small());
  EXPECT_EQ(d.columns, (std::vector<std::string>{"a", "b", "OT"}));
  EXPECT_EQ(d.target_index, 2);
  // 140 / 20 / 40 rows; val and test start seq_len rows early.
  EXPECT_EQ(d.train.values.size(0), 140);
  EXPECT_EQ(d.train.num_windows, 140 - 24 - 6 + 1);
  EXPECT_EQ(d.val.values.size(0), 44);
  EXPECT_EQ(d.val.num_windows, 44 - 30 + 1);
  EXPECT_EQ(d.test.values.size(0), 64);
  EXPECT_EQ(d.test.num_windows, 64 - 30 + 1);
  // Scaled with the training rows' mean and population std: column a is 0..139 there.
  EXPECT_NEAR(d.mean[0].item<double>(), 69.5, 1e-4);
  EXPECT_NEAR(d.std[0].item<double>(), std::sqrt((140.0 * 140.0 - 1) / 12), 1e-3);
  EXPECT_NEAR(d.train.values.mean(0).abs().max().item<double>(), 0.0, 1e-5);
  EXPECT_NEAR(d.train.values.std(0, false).sub(1).abs().max().item<double>(), 0.0, 1e-5);
  // The test part's first row is row 136 of the file.
  EXPECT_NEAR(d.test.values[0][0].item<double>(), (136 - 69.5) / d.std[0].item<double>(), 1e-4);
  // Marks: month, day, weekday (Monday 0), hour.
  EXPECT_TRUE(torch::equal(d.train.marks[0], torch::tensor({1.f, 1.f, 4.f, 0.f})));
  EXPECT_TRUE(torch::equal(d.train.marks[25], torch::tensor({1.f, 2.f, 5.f, 1.f})));

  const auto w = ddp::data::window(d.train, small(), 3);
  EXPECT_TRUE(torch::equal(w.encoder, d.train.values.narrow(0, 3, 24)));
  EXPECT_TRUE(torch::equal(w.decoder, d.train.values.narrow(0, 3 + 24 - 12, 18)));
  EXPECT_TRUE(torch::equal(w.decoder_marks, d.train.marks.narrow(0, 15, 18)));
}

TEST(TimeSeries, FeaturesAndTargetChooseTheColumns) {
  ddp::testing::TempDir dir;
  ddp::testing::write_file(dir.file("d.csv"), hourly_csv(200));
  auto o = small();
  o.features = "S";
  EXPECT_EQ(ddp::data::load_time_series(dir.file("d.csv"), o).columns,
            std::vector<std::string>{"OT"});
  o.features = "MS";
  o.target = "a";
  EXPECT_EQ(ddp::data::load_time_series(dir.file("d.csv"), o).columns,
            (std::vector<std::string>{"b", "OT", "a"}));
  // A file without the date column: zero marks.
  std::istringstream lines(hourly_csv(200));
  std::string undated;
  for (std::string line; std::getline(lines, line);)
    undated += line.substr(line.find(',') + 1) + "\n";
  ddp::testing::write_file(dir.file("u.csv"), undated);
  const auto d = ddp::data::load_time_series(dir.file("u.csv"), small());
  EXPECT_EQ(d.columns, (std::vector<std::string>{"a", "b", "OT"}));
  EXPECT_EQ(d.train.marks.abs().sum().item<float>(), 0.f);
}

TEST(TimeSeries, DatesGiveMonthDayWeekdayHour) {
  int f[4];
  ASSERT_TRUE(ddp::data::parse_time_features("2024-02-29 13:45:00", f));
  EXPECT_EQ(std::vector<int>(f, f + 4), (std::vector<int>{2, 29, 3, 13}));  // a Thursday
  ASSERT_TRUE(ddp::data::parse_time_features("1999-12-31", f));
  EXPECT_EQ(std::vector<int>(f, f + 4), (std::vector<int>{12, 31, 4, 0}));  // a Friday
  EXPECT_FALSE(ddp::data::parse_time_features("yesterday", f));
  EXPECT_FALSE(ddp::data::parse_time_features("2024-13-01", f));
}

TEST(TimeSeries, BadFilesNameFileLineAndColumn) {
  std::string csv = hourly_csv(200);
  EXPECT_EQ(csv_error_of(csv,
                         [] {
                           auto o = small();
                           o.target = "price";
                           return o;
                         }()),
            "d.csv: no target column 'price' (columns: date, a, b, OT)");
  std::string bad = csv;
  bad.replace(bad.find(",7,15,"), 6, ",7,x5,");  // the row of r = 7: line 9
  EXPECT_EQ(csv_error_of(bad), "d.csv:9: column 'b': 'x5' is not a number");
  std::string ragged = csv;
  ragged.replace(ragged.find(",3,7,"), 5, ",3,");  // line 5 loses a cell
  EXPECT_EQ(csv_error_of(ragged), "d.csv:5: 3 cells where the header has 4 columns");
  std::string undated = csv;
  undated.replace(undated.find("2021-01-01 02:00:00"), 19, "soon");
  EXPECT_EQ(csv_error_of(undated),
            "d.csv:4: column 'date': 'soon' is not a date (YYYY-MM-DD HH:MM:SS)");
  EXPECT_EQ(csv_error_of(hourly_csv(40)),
            "d.csv: 40 rows give the training part 28 rows, fewer than seq_len + pred_len = 30 "
            "(use a longer file or shorter windows)");
  EXPECT_EQ(csv_error_of(""), "d.csv: empty file");
  EXPECT_EQ(csv_error_of("date,a\n"), "d.csv: a header but no rows");
}

TEST(TimeSeries, WindowDatasetViewsEachWindowAndItsFuture) {
  ddp::testing::TempDir dir;
  ddp::testing::write_file(dir.file("d.csv"), hourly_csv(200));
  for (const char* features : {"M", "MS"}) {
    auto o = small();
    o.features = features;
    const auto d = ddp::data::load_time_series(dir.file("d.csv"), o);
    const auto set = ddp::data::window_dataset(d, d.test, o);
    const int64_t outputs = std::string(features) == "M" ? 3 : 1;
    ASSERT_EQ(set.size(), d.test.num_windows);
    EXPECT_EQ(set.inputs.sizes(), (std::vector<int64_t>{d.test.num_windows, 30, 3 + 4}));
    EXPECT_EQ(set.targets.sizes(), (std::vector<int64_t>{d.test.num_windows, 6, outputs}));
    EXPECT_EQ(set.task, ddp::data::Task::kRegression);
    for (int64_t i : {int64_t{0}, int64_t{5}, d.test.num_windows - 1}) {
      EXPECT_TRUE(torch::equal(set.inputs[i],
                               torch::cat({d.test.values, d.test.marks}, 1).narrow(0, i, 30)));
      EXPECT_TRUE(torch::equal(set.targets[i],
                               d.test.values.narrow(0, i + 24, 6).narrow(1, 3 - outputs, outputs)));
    }
    // A batch gathered from the views is what the windows hold.
    const auto batch = set.gather(torch::tensor({4, 1}));
    EXPECT_TRUE(torch::equal(batch.input[0], set.inputs[4]));
    EXPECT_TRUE(torch::equal(batch.target[1], set.targets[1]));
  }
}

TEST(TimeSeries, SyntheticSeriesIsReproducibleHourlyAndSeasonal) {
  const std::string csv = ddp::data::synthetic_time_series_csv();
  EXPECT_EQ(csv, ddp::data::synthetic_time_series_csv());
  EXPECT_NE(csv, ddp::data::synthetic_time_series_csv(10000, 11, 1));
  std::istringstream in(csv);
  const auto table = ddp::data::parse_csv(in, "synthetic");
  ASSERT_EQ(table.rows.size(), 10000u);
  ASSERT_EQ(table.columns.size(), 12u);
  EXPECT_EQ(table.columns.front(), "date");
  EXPECT_EQ(table.columns.back(), "OT");
  EXPECT_EQ(table.rows[0][0], "2016-07-01 00:00:00");
  EXPECT_EQ(table.rows[25][0], "2016-07-02 01:00:00");
  EXPECT_EQ(table.rows[9999][0], "2017-08-21 15:00:00");  // 416 days and 15 hours later

  auto o = small();
  o.seq_len = 96;
  o.label_len = 48;
  o.pred_len = 24;
  const auto d = ddp::data::load_time_series(table, "synthetic", o);
  const auto x = d.train.values;  // [7000, 11], scaled
  auto correlation = [](const torch::Tensor& a, const torch::Tensor& b) {
    const auto da = a - a.mean(), db = b - b.mean();
    return ((da * db).sum() / (da.norm() * db.norm())).item<double>();
  };
  const auto ot = x.select(1, 10);
  // A daily cycle: OT a day apart is far more alike than half a day apart.
  EXPECT_GT(correlation(ot.narrow(0, 0, 6000), ot.narrow(0, 24, 6000)),
            correlation(ot.narrow(0, 0, 6000), ot.narrow(0, 12, 6000)) + 0.2);
  // Cross-correlated series: some pair of columns correlates strongly.
  double strongest = 0.0;
  for (int64_t i = 0; i < 11; ++i) {
    for (int64_t j = i + 1; j < 11; ++j) {
      strongest = std::max(strongest, std::abs(correlation(x.select(1, i), x.select(1, j))));
    }
  }
  EXPECT_GT(strongest, 0.5);
}

}  // namespace
