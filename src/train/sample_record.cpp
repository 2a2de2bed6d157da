#include "sample_record.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"

namespace ddp::train {
namespace {

std::string samples_line(int64_t epoch, int64_t step, const std::vector<std::string>& all) {
  nlohmann::ordered_json line;
  line["epoch"] = epoch;
  line["step"] = step;
  line["ids"] = nlohmann::ordered_json::array();
  for (const std::string& bytes : all) {
    std::vector<int64_t> rank_ids(bytes.size() / sizeof(int64_t));
    std::memcpy(rank_ids.data(), bytes.data(), rank_ids.size() * sizeof(int64_t));
    line["ids"].push_back(rank_ids);
  }
  return line.dump();
}

// `line` at the end of <dir>/samples.jsonl, or (`fresh`) as its first line. Opened for each line:
// after an elastic change the heal may have rewritten the file, or another rank 0 written it.
void append_samples_line(const std::string& dir, const std::string& line, bool fresh) {
  const std::string path = (std::filesystem::path(dir) / "samples.jsonl").string();
  std::ofstream file(path, fresh ? std::ios::trunc : std::ios::app);
  file << line << '\n' << std::flush;
  if (!file) throw Error(fmt::format("{}: cannot write the sample record", path));
}

}  // namespace

std::vector<std::string> gather_sample_ids(const Distributed& dist, const torch::Tensor& ids) {
  const std::string mine(reinterpret_cast<const char*>(ids.data_ptr<int64_t>()),
                         static_cast<size_t>(ids.numel()) * sizeof(int64_t));
  return comm::all_gather_bytes(*dist.group, mine, dist.device);
}

std::string record_samples(const Config& config, const Distributed& dist, int64_t epoch,
                           int64_t step, const std::vector<std::string>& all) {
  if (!config.record_samples) return "";
  std::string line = samples_line(epoch, step, all);
  // A group restarted without a checkpoint trains from step 1 again: its record starts again too
  // (as metrics.jsonl does), or the first round's steps would stay in it.
  const bool fresh = step == 1 && !dist.joining;
  if (dist.is_main()) append_samples_line(config.output_dir, line, fresh);
  return line;
}

}  // namespace ddp::train
