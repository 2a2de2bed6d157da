#include "ddp/train/timeline.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstring>

#include "ddp/comm/flight_recorder.h"
#include "ddp/comm/process_group.h"
#include "ddp/common/files.h"
#include "ddp/common/log.h"

namespace ddp::train {

Timeline::Timeline(size_t max_events)
    : max_events_(max_events), start_steady_(Clock::now()), start_wall_(comm::wall_time()) {
  events_.reserve(std::min<size_t>(max_events_, 65536));
}

void Timeline::add(const char* name, const char* category, int lane, Clock::time_point begin,
                   Clock::time_point end, int64_t step, int64_t bytes) {
  if (events_.size() >= max_events_) {
    if (dropped_++ == 0) {
      log::warn("timeline: {} events recorded, later ones are dropped", max_events_);
    }
    return;
  }
  events_.push_back({name, category, lane, begin, end, step, bytes});
}

std::string Timeline::trace_events(int rank, double origin_wall) const {
  // Steady-clock times become wall-clock microseconds through the pair taken at construction.
  const double offset_us = (start_wall_ - origin_wall) * 1e6;
  const auto us = [&](Clock::time_point t) {
    return offset_us + std::chrono::duration<double, std::micro>(t - start_steady_).count();
  };
  // Metadata first: the process is the rank, lane 0 the step, the others the buckets.
  std::string out = fmt::format(
      "{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {0}, \"tid\": 0, \"args\": "
      "{{\"name\": \"rank {0}\"}}}},\n{{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": "
      "{0}, \"tid\": 0, \"args\": {{\"sort_index\": {0}}}}}",
      rank);
  int lanes = 0;
  for (const auto& e : events_) lanes = std::max(lanes, e.lane + 1);
  for (int lane = 0; lane < std::max(lanes, 1); ++lane) {
    const std::string name = lane == kStepLane
                                 ? "training step"
                                 : fmt::format("bucket {} all-reduce", lane - kBucketLane);
    out += fmt::format(
        ",\n{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": {}, \"tid\": {}, \"args\": "
        "{{\"name\": \"{}\"}}}}",
        rank, lane, name);
  }
  for (const auto& e : events_) {
    std::string args;
    if (e.step >= 0) args += fmt::format("\"step\": {}", e.step);
    if (e.bytes >= 0) args += fmt::format("{}\"bytes\": {}", args.empty() ? "" : ", ", e.bytes);
    const double begin = us(e.begin);
    out += fmt::format(
        ",\n{{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"pid\": {}, \"tid\": {}, "
        "\"ts\": {:.3f}, \"dur\": {:.3f}, \"args\": {{{}}}}}",
        e.name, e.category, rank, e.lane, begin, std::max(0.0, us(e.end) - begin), args);
  }
  return out;
}

std::string chrome_trace(const std::vector<std::string>& rank_events) {
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  for (size_t r = 0; r < rank_events.size(); ++r) {
    if (r > 0) out += ",\n";
    out += rank_events[r];
  }
  return out + "\n]}\n";
}

void write_timeline(comm::ProcessGroup& group, const c10::Device& device, const Timeline& timeline,
                    const std::string& path) {
  group.set_phase("timeline");
  const auto on_device = torch::TensorOptions().device(device);
  // Time zero: the earliest start of any rank.
  auto origin = torch::full({1}, timeline.start_wall(), on_device.dtype(torch::kDouble));
  group.all_reduce(origin, comm::ReduceOp::kMin)->wait();
  const std::string mine = timeline.trace_events(group.rank(), origin.cpu().item<double>());

  // Every rank's text to rank 0: the lengths, then the texts padded to the longest.
  const int world = group.world_size();
  auto length = torch::full({1}, static_cast<int64_t>(mine.size()), on_device.dtype(torch::kLong));
  auto lengths = torch::empty({world}, length.options());
  group.all_gather(lengths, length)->wait();
  lengths = lengths.cpu();
  const int64_t longest = lengths.max().item<int64_t>();
  auto text = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(text.data_ptr<uint8_t>(), mine.data(), mine.size());
  text = text.to(device);
  auto texts = torch::empty({longest * world}, text.options());
  group.all_gather(texts, text)->wait();
  if (group.rank() != 0) return;

  texts = texts.cpu();
  std::vector<std::string> ranks;
  for (int r = 0; r < world; ++r) {
    const auto* bytes = texts.data_ptr<uint8_t>() + r * longest;
    ranks.emplace_back(reinterpret_cast<const char*>(bytes),
                       static_cast<size_t>(lengths[r].item<int64_t>()));
  }
  write_file_atomically(path, chrome_trace(ranks));
  log::info("timeline: {} events of rank 0 ({} ranks) written to {}", timeline.events().size(),
            world, path);
}

}  // namespace ddp::train
