// The time-series CSV reader and Informer's data preparation on arbitrary text, with short
// windows so that small inputs reach the splitting and scaling.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "ddp/common/error.h"
#include "ddp/data/time_series.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const auto table = ddp::data::parse_csv(in, "fuzz.csv");
    ddp::data::TimeSeriesOptions o;
    o.seq_len = 3;
    o.label_len = 1;
    o.pred_len = 1;
    for (const char* features : {"M", "MS", "S"}) {
      o.features = features;
      const auto series = ddp::data::load_time_series(table, "fuzz.csv", o);
      ddp::data::window_dataset(series, series.test, o);
    }
  } catch (const ddp::InputError&) {
  }
  return 0;
}
