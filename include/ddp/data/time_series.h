#pragma once
// Multivariate time series from a CSV file in the ETT layout (a date column, numeric columns,
// the target last), prepared as the Informer code prepares it (Dataset_Custom): a 70/10/20 split
// in time order, standard scaling fitted on the training part only, and sliding windows of
// seq_len (encoder), label_len (known decoder start) and pred_len (forecast).

#include <torch/types.h>

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "ddp/data/dataset.h"

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
// The same from a stream; `name` stands for the file in messages.
CsvTable parse_csv(std::istream& in, const std::string& name);

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
// The same from a table read elsewhere; `name` stands for the file in messages.
TimeSeriesData load_time_series(const CsvTable& table, const std::string& name,
                                const TimeSeriesOptions& options);

// How many columns the model predicts: all of them for M, the target alone for S and MS (it is
// the last column, so the outputs are always the last ones).
int64_t output_columns(const TimeSeriesData& data, const TimeSeriesOptions& options);

// The windows of a split as a regression dataset, views of the split (no copy):
//   input  [windows, seq_len + pred_len, columns + 4]: each window's rows, values then marks.
//          It holds the future values too, as Informer's batch_y does: whoever builds the
//          decoder input must replace them by zeros (see train/workload.cpp).
//   target [windows, pred_len, output_columns]: the values to forecast.
TensorDataset window_dataset(const TimeSeriesData& data, const TimeSeriesSplit& split,
                             const TimeSeriesOptions& options);

// Window `i` of a split: the encoder input [seq_len, D], its marks, the decoder's known part and
// target [label_len + pred_len, D], and their marks.
struct Window {
  torch::Tensor encoder, encoder_marks, decoder, decoder_marks;
};
Window window(const TimeSeriesSplit& split, const TimeSeriesOptions& options, int64_t i);

// A reproducible synthetic series in the ETT layout, the default data of configs/informer_csv.yaml:
// a header "date,x1,..,x<series-1>,OT", then `rows` hourly rows from 2016-07-01 00:00:00. Each
// series mixes a daily and a weekly cycle, a trend, a factor shared by all series (their
// cross-correlation) and its own noise; the same text for the same arguments on every machine.
std::string synthetic_time_series_csv(int64_t rows = 10000, int64_t series = 11, uint64_t seed = 0);

// month, day, weekday (Monday 0), hour of "YYYY-MM-DD[ HH[:MM[:SS]]]"; false when unparsable.
bool parse_time_features(const std::string& text, int values[4]);

}  // namespace ddp::data
