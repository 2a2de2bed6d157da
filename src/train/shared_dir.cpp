#include "shared_dir.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <filesystem>
#include <random>

#include "ddp/common/error.h"
#include "ddp/common/files.h"

namespace ddp::train {

std::vector<int> ranks_not_seeing(const std::vector<int64_t>& seen) {
  std::vector<int> ranks;
  for (size_t r = 0; r < seen.size(); ++r) {
    if (seen[r] == 0) ranks.push_back(static_cast<int>(r));
  }
  return ranks;
}

void check_dir_shared(comm::ProcessGroup& group, const torch::Device& device,
                      const std::string& dir, const std::string& needed_by) {
  if (group.world_size() == 1) return;
  const auto options = torch::TensorOptions(torch::kInt64).device(device);
  // A name of its own: a name looked up before may still be cached as absent by a network file
  // system's client.
  auto name_of = [&](int64_t token) {
    return std::filesystem::path(dir) / fmt::format(".ddp-shared-{}", token);
  };
  auto token = torch::zeros({1}, options);
  if (group.rank() == 0) {  // written before the others learn its name
    const auto mine = static_cast<int64_t>(std::random_device{}());
    write_file_atomically(name_of(mine).string(), "written by rank 0\n");
    token.fill_(mine);
  }
  group.broadcast(token, 0)->wait();
  const auto path = name_of(token.cpu().item<int64_t>());
  auto seen = torch::zeros({group.world_size()}, options);
  seen[group.rank()] = std::filesystem::exists(path) ? 1 : 0;
  group.all_reduce(seen, comm::ReduceOp::kSum)->wait();
  if (group.rank() == 0) std::filesystem::remove(path);
  const auto cpu = seen.cpu();
  const auto missing =
      ranks_not_seeing({cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel()});
  if (missing.empty()) return;
  throw InputError(fmt::format(
      "{}: the output directory '{}' is not the same directory on every rank: rank(s) {} do not "
      "see the file rank 0 wrote there. A sharded checkpoint is read from every rank's file at a "
      "resume, and rank 0 deletes the old ones, so it needs a directory every host shares (a "
      "network or cluster file system); or leave {} out (the checkpoint is then gathered and "
      "written by rank 0)",
      needed_by, dir, fmt::join(missing, ", "), needed_by));
}

}  // namespace ddp::train
