#pragma once
// Multivariate time series from a CSV file in the ETT layout (a date column, numeric columns,
// the target last), prepared as the Informer code prepares it (Dataset_Custom): a 70/10/20 split
// in time order, standard scaling fitted on the training part only, and sliding windows of
// seq_len (encoder), label_len (known decoder start) and pred_len (forecast).

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::data {

// A CSV file: a header row, then rows of the same number of cells.
struct CsvTable {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
  std::vector<int64_t> lines;  // the file's line number of each row (for messages)
};

// Reads `path`. Throws InputError naming the file (and line) for a missing or empty file, a
// missing header, or a row whose number of cells differs from the header's.
CsvTable read_csv(const std::string& path);

struct TimeSeriesOptions {
  std::string date_column = "date";  // "" or absent from the file: no time features
  std::string target;                // "": the last column
  std::string features = "M";        // M: all to all; S: target to target; MS: all to target
  int64_t seq_len = 96;
  int64_t label_len = 48;
  int64_t pred_len = 24;
};

// One split: its rows (scaled) and the windows over them.
struct TimeSeriesSplit {
  torch::Tensor values;  // [rows, columns] float32, scaled with the training part's statistics
  torch::Tensor marks;   // [rows, 4] float32: month, day, weekday, hour (zeros without dates)
  int64_t num_windows = 0;
};

struct TimeSeriesData {
  std::vector<std::string> columns;  // the value columns, in order (the target last for M/MS)
  int64_t target_index = 0;          // of the target among `columns`
  torch::Tensor mean, std;           // [columns]: the scaler, fitted on the training rows
  TimeSeriesSplit train, val, test;
};

// Reads and prepares `path`. Throws InputError naming the file, line and column for a missing
// column, a non-numeric cell or an unparsable date, ragged rows, an empty file, or a split with
// fewer rows than seq_len + pred_len.
TimeSeriesData load_time_series(const std::string& path, const TimeSeriesOptions& options);

// Window `i` of a split: the encoder input [seq_len, D], its marks, the decoder's known part and
// target [label_len + pred_len, D], and their marks.
struct Window {
  torch::Tensor encoder, encoder_marks, decoder, decoder_marks;
};
Window window(const TimeSeriesSplit& split, const TimeSeriesOptions& options, int64_t i);

// month, day, weekday (Monday 0), hour of "YYYY-MM-DD[ HH[:MM[:SS]]]"; false when unparsable.
bool parse_time_features(const std::string& text, int values[4]);

}  // namespace ddp::data
