#include "scheduler_env.h"

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp/common/whole_number.h"

namespace ddp::launch {
namespace {

std::optional<std::string> get(const std::map<std::string, std::string>& env,
                               const std::string& key) {
  auto it = env.find(key);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

std::optional<int> get_int(const std::map<std::string, std::string>& env, const std::string& key,
                           int min, int max) {
  const auto text = get(env, key);
  if (!text) return std::nullopt;
  if (const auto value = whole_number(*text, min, max)) return value;
  throw InputError(
      fmt::format("{}: expected an integer from {} to {}, got '{}'", key, min, max, *text));
}

void read_master(const std::map<std::string, std::string>& env, SchedulerShape& shape) {
  shape.master_addr = get(env, "MASTER_ADDR");
  if (shape.master_addr && shape.master_addr->empty()) shape.master_addr.reset();
  shape.master_port = get_int(env, "MASTER_PORT", 1, 65535);
}

}  // namespace

SchedulerShape read_scheduler_shape(const std::map<std::string, std::string>& env,
                                    bool shape_given, bool node_rank_given, int nnodes) {
  constexpr int kMany = 1 << 20;
  SchedulerShape shape;
  if (!shape_given && env.count("RANK") != 0 && env.count("WORLD_SIZE") != 0) {
    shape.nnodes = get_int(env, "WORLD_SIZE", 1, kMany);
    shape.node_rank = get_int(env, "RANK", 0, *shape.nnodes - 1);
    shape.nproc = 1;
    shape.local_world_size = get_int(env, "LOCAL_WORLD_SIZE", 1, kMany);
    shape.local_rank = get_int(env, "LOCAL_RANK", 0, shape.local_world_size.value_or(kMany) - 1);
    shape.group_rank = get_int(env, "NODE_RANK", 0, kMany);
    read_master(env, shape);
    shape.contract = fmt::format(
        "RANK {} and WORLD_SIZE {}: one process in this pod or worker, rank {} of {}",
        *shape.node_rank, *shape.nnodes, *shape.node_rank, *shape.nnodes);
    return shape;
  }
  if (!node_rank_given && nnodes > 1 && env.count("NODE_RANK") != 0) {
    shape.node_rank = get_int(env, "NODE_RANK", 0, nnodes - 1);
    read_master(env, shape);
    shape.contract = fmt::format("NODE_RANK {}: this node's rank", *shape.node_rank);
  }
  return shape;
}

}  // namespace ddp::launch
