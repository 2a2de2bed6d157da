#include "ddp/data/time_series.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "ddp/common/error.h"

namespace ddp::data {
namespace {

std::string trimmed(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

// The cells of one line: comma-separated, a cell in double quotes may hold commas ("" is a quote).
std::vector<std::string> split_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.push_back(trimmed(cell));
      cell.clear();
    } else {
      cell += c;
    }
  }
  cells.push_back(trimmed(cell));
  return cells;
}

// Days since 1970-01-01 of a civil date (Howard Hinnant's days_from_civil).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

int64_t column_index(const CsvTable& table, const std::string& name, const std::string& path,
                     const char* what) {
  auto it = std::find(table.columns.begin(), table.columns.end(), name);
  if (it == table.columns.end()) {
    std::string known;
    for (const auto& c : table.columns) known += (known.empty() ? "" : ", ") + c;
    throw InputError(fmt::format("{}: no {} column '{}' (columns: {})", path, what, name, known));
  }
  return it - table.columns.begin();
}

}  // namespace

CsvTable read_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  return parse_csv(in, path);
}

CsvTable parse_csv(std::istream& in, const std::string& path) {
  CsvTable table;
  std::string line;
  int64_t number = 0;
  std::vector<int64_t> lines;
  while (std::getline(in, line)) {
    ++number;
    if (trimmed(line).empty()) continue;
    auto cells = split_cells(line);
    if (table.columns.empty()) {
      table.columns = std::move(cells);
      continue;
    }
    if (cells.size() != table.columns.size()) {
      throw InputError(fmt::format("{}:{}: {} cells where the header has {} columns", path, number,
                                   cells.size(), table.columns.size()));
    }
    table.rows.push_back(std::move(cells));
    table.lines.push_back(number);
  }
  if (table.columns.empty()) throw InputError(fmt::format("{}: empty file", path));
  if (table.rows.empty()) throw InputError(fmt::format("{}: a header but no rows", path));
  return table;
}

bool parse_time_features(const std::string& text, int values[4]) {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  char tail = 0;
  const int n = std::sscanf(text.c_str(), "%d-%d-%d%*[ T]%d:%d:%d%c", &year, &month, &day, &hour,
                            &minute, &second, &tail);
  if (n < 3 || n == 7 || month < 1 || month > 12 || day < 1 || day > 31 || hour < 0 || hour > 23) {
    return false;
  }
  const int64_t days = days_from_civil(year, month, day);
  values[0] = month;
  values[1] = day;
  values[2] = static_cast<int>(((days % 7) + 7 + 3) % 7);  // 1970-01-01 was a Thursday (3)
  values[3] = n >= 4 ? hour : 0;
  return true;
}

namespace {
void check_options(const TimeSeriesOptions& o) {
  if (o.features != "M" && o.features != "S" && o.features != "MS") {
    throw InputError(fmt::format("features '{}': expected M, S or MS", o.features));
  }
  if (o.seq_len < 1 || o.pred_len < 1 || o.label_len < 0 || o.label_len > o.seq_len) {
    throw InputError(
        fmt::format("seq_len {}, label_len {}, pred_len {}: expected seq_len >= 1, "
                    "pred_len >= 1 and 0 <= label_len <= seq_len",
                    o.seq_len, o.label_len, o.pred_len));
  }
}
}  // namespace

TimeSeriesData load_time_series(const std::string& path, const TimeSeriesOptions& o) {
  check_options(o);  // before reading what may be a large file
  return load_time_series(read_csv(path), path, o);
}

namespace {

// The value columns: every column but the date, the target moved last (Informer's order); only
// the target for features S.
std::vector<int64_t> value_columns_of(const CsvTable& table, const TimeSeriesOptions& o,
                                      int64_t date_index, const std::string& path) {
  int64_t target = -1;
  if (o.target.empty()) {
    for (int64_t c = static_cast<int64_t>(table.columns.size()) - 1; c >= 0; --c) {
      if (c != date_index) {
        target = c;
        break;
      }
    }
    if (target < 0) throw InputError(fmt::format("{}: no value column", path));
  } else {
    target = column_index(table, o.target, path, "target");
  }
  std::vector<int64_t> columns;
  if (o.features != "S") {
    for (int64_t c = 0; c < static_cast<int64_t>(table.columns.size()); ++c) {
      if (c != date_index && c != target) columns.push_back(c);
    }
  }
  columns.push_back(target);
  return columns;
}

// A cell of `row` that must be a finite number.
double parse_number(const CsvTable& table, size_t row, size_t column, const std::string& path) {
  const std::string& cell = table.rows[row][column];
  char* end = nullptr;
  const double x = std::strtod(cell.c_str(), &end);
  if (cell.empty() || end != cell.c_str() + cell.size() || !std::isfinite(x)) {
    throw InputError(fmt::format("{}:{}: column '{}': '{}' is not a number", path, table.lines[row],
                                 table.columns[column], cell));
  }
  return x;
}

// The values of `columns` ([rows, columns.size()] float64) and the time features of the date
// column ([rows, 4] float32, zeros without one), row by row: the first bad cell of the file is
// the one reported.
std::pair<torch::Tensor, torch::Tensor> parse_rows(const CsvTable& table,
                                                   const std::vector<int64_t>& columns,
                                                   int64_t date_index, const std::string& path,
                                                   const std::string& date_column) {
  const auto rows = static_cast<int64_t>(table.rows.size());
  const auto cols = static_cast<int64_t>(columns.size());
  auto values = torch::empty({rows, cols}, torch::kDouble);
  auto marks = torch::zeros({rows, 4}, torch::kFloat);
  auto v = values.accessor<double, 2>();
  auto mk = marks.accessor<float, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<size_t>(r);
    for (int64_t j = 0; j < cols; ++j) {
      v[r][j] =
          parse_number(table, row, static_cast<size_t>(columns[static_cast<size_t>(j)]), path);
    }
    if (date_index < 0) continue;
    int f[4];
    const std::string& cell = table.rows[row][static_cast<size_t>(date_index)];
    if (!parse_time_features(cell, f)) {
      throw InputError(fmt::format("{}:{}: column '{}': '{}' is not a date (YYYY-MM-DD HH:MM:SS)",
                                   path, table.lines[row], date_column, cell));
    }
    for (int k = 0; k < 4; ++k) mk[r][k] = static_cast<float>(f[k]);
  }
  return {values, marks};
}

// Cuts the scaled values and the marks into the training, validation and test parts with
// Informer's Dataset_Custom borders (70 % / 10 % / 20 %): val and test start seq_len rows early,
// so that their first window's encoder input is the history just before them.
void split_parts(TimeSeriesData& out, const torch::Tensor& scaled, const torch::Tensor& marks,
                 const TimeSeriesOptions& o, const std::string& path) {
  const int64_t rows = scaled.size(0);
  const int64_t num_train = static_cast<int64_t>(static_cast<double>(rows) * 0.7);
  const int64_t num_test = static_cast<int64_t>(static_cast<double>(rows) * 0.2);
  const int64_t num_val = rows - num_train - num_test;
  const int64_t begins[3] = {0, num_train - o.seq_len, rows - num_test - o.seq_len};
  const int64_t ends[3] = {num_train, num_train + num_val, rows};
  const char* names[3] = {"training", "validation", "test"};
  TimeSeriesSplit* splits[3] = {&out.train, &out.val, &out.test};
  for (int s = 0; s < 3; ++s) {
    const int64_t length = ends[s] - std::max<int64_t>(begins[s], 0);
    const int64_t windows = length - o.seq_len - o.pred_len + 1;
    if (begins[s] < 0 || windows < 1) {
      throw InputError(fmt::format(
          "{}: {} rows give the {} part {} rows, fewer than seq_len + pred_len = {} (use a longer "
          "file or shorter windows)",
          path, rows, names[s], std::max<int64_t>(length, 0), o.seq_len + o.pred_len));
    }
    splits[s]->values = scaled.narrow(0, begins[s], length);
    splits[s]->marks = marks.narrow(0, begins[s], length);
    splits[s]->num_windows = windows;
  }
}

}  // namespace

TimeSeriesData load_time_series(const CsvTable& table, const std::string& path,
                                const TimeSeriesOptions& o) {
  check_options(o);
  const bool dated = !o.date_column.empty() && std::find(table.columns.begin(), table.columns.end(),
                                                         o.date_column) != table.columns.end();
  const int64_t date_index = dated ? column_index(table, o.date_column, path, "date") : -1;
  const std::vector<int64_t> value_columns = value_columns_of(table, o, date_index, path);
  const auto [values, marks] = parse_rows(table, value_columns, date_index, path, o.date_column);

  TimeSeriesData out;
  for (int64_t c : value_columns) out.columns.push_back(table.columns[static_cast<size_t>(c)]);
  out.target_index = static_cast<int64_t>(value_columns.size()) - 1;
  // Scaled by the training part's mean and population std, as sklearn's StandardScaler (which
  // Informer's data loader uses) does.
  const int64_t num_train = static_cast<int64_t>(static_cast<double>(values.size(0)) * 0.7);
  const auto train_rows = values.narrow(0, 0, num_train);
  out.mean = train_rows.mean(0);
  out.std = train_rows.std(0, /*unbiased=*/false).clamp_min(1e-12);
  const auto scaled = ((values - out.mean) / out.std).to(torch::kFloat);
  out.mean = out.mean.to(torch::kFloat);
  out.std = out.std.to(torch::kFloat);
  split_parts(out, scaled, marks, o, path);
  return out;
}

Window window(const TimeSeriesSplit& split, const TimeSeriesOptions& o, int64_t i) {
  DDP_CHECK(i >= 0 && i < split.num_windows, "window index in [0, num_windows)");
  const int64_t decoder_begin = i + o.seq_len - o.label_len;
  const int64_t decoder_length = o.label_len + o.pred_len;
  return {split.values.narrow(0, i, o.seq_len), split.marks.narrow(0, i, o.seq_len),
          split.values.narrow(0, decoder_begin, decoder_length),
          split.marks.narrow(0, decoder_begin, decoder_length)};
}

int64_t output_columns(const TimeSeriesData& data, const TimeSeriesOptions& o) {
  return o.features == "M" ? static_cast<int64_t>(data.columns.size()) : 1;
}

TensorDataset window_dataset(const TimeSeriesData& data, const TimeSeriesSplit& split,
                             const TimeSeriesOptions& o) {
  const int64_t length = o.seq_len + o.pred_len;
  const int64_t columns = split.values.size(1), outputs = output_columns(data, o);
  TensorDataset set;
  set.task = Task::kRegression;
  // unfold gives [windows, features, length] views; transposed, [windows, length, features].
  set.inputs = torch::cat({split.values, split.marks}, 1).unfold(0, length, 1).transpose(1, 2);
  set.targets = split.values.narrow(1, columns - outputs, outputs)
                    .narrow(0, o.seq_len, split.values.size(0) - o.seq_len)
                    .unfold(0, o.pred_len, 1)
                    .transpose(1, 2);
  DDP_CHECK(set.inputs.size(0) == split.num_windows && set.targets.size(0) == split.num_windows,
            "one input and one target per window");
  return set;
}

namespace {

constexpr double kTwoPi = 6.283185307179586;

// splitmix64: a small generator whose numbers are the same everywhere (the standard library's
// distributions are not).
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {                                                           // Box-Muller
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(kTwoPi * v);
  }

 private:
  uint64_t state_;
};

// The civil date of a day count since 1970-01-01 (Howard Hinnant's civil_from_days).
void civil_from_days(int64_t z, int64_t& y, int64_t& m, int64_t& d) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y = yoe + era * 400 + (m <= 2);
}

}  // namespace

std::string synthetic_time_series_csv(int64_t rows, int64_t series, uint64_t seed) {
  SplitMix rng(seed);
  struct Series {
    double level, daily, daily_phase, weekly, weekly_phase, trend, shared, noise;
  };
  std::vector<Series> params(static_cast<size_t>(series));
  for (auto& p : params) {
    p = {10.0 * rng.normal(), 1.0 + 2.0 * rng.uniform(), kTwoPi * rng.uniform(),
         0.5 + rng.uniform(), kTwoPi * rng.uniform(),    4.0 * (rng.uniform() - 0.5),
         0.5 + rng.uniform(), 0.1 + 0.2 * rng.uniform()};
  }
  std::string out = "date";
  for (int64_t j = 1; j < series; ++j) out += fmt::format(",x{}", j);
  out += ",OT\n";
  const int64_t start = days_from_civil(2016, 7, 1);
  double shared = 0.0;  // an AR(1) factor in every series: their cross-correlation
  for (int64_t t = 0; t < rows; ++t) {
    int64_t y = 0, m = 0, d = 0;
    civil_from_days(start + t / 24, y, m, d);
    out += fmt::format("{:04d}-{:02d}-{:02d} {:02d}:00:00", y, m, d, t % 24);
    shared = 0.95 * shared + 0.3 * rng.normal();
    const double day = kTwoPi * static_cast<double>(t) / 24.0;
    const double week = kTwoPi * static_cast<double>(t) / 168.0;
    for (const auto& p : params) {
      const double value = p.level + p.daily * std::sin(day + p.daily_phase) +
                           p.weekly * std::sin(week + p.weekly_phase) +
                           p.trend * static_cast<double>(t) / static_cast<double>(rows) +
                           p.shared * shared + p.noise * rng.normal();
      out += fmt::format(",{:.4f}", value);
    }
    out += '\n';
  }
  return out;
}

}  // namespace ddp::data
