#include "ddp/comm/host_collectives.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ddp/common/error.h"

namespace ddp::comm {
namespace {

// `bytes` zero-padded to `size`, on `device`.
at::Tensor padded(const std::string& bytes, size_t size, const c10::Device& device) {
  auto t = at::zeros({static_cast<int64_t>(size)}, at::kByte);
  if (!bytes.empty()) std::memcpy(t.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return t.to(device);
}

// The `record_bytes`-sized records of a gathered tensor, each cut to its length.
std::vector<std::string> records(const at::Tensor& gathered, size_t record_bytes,
                                 const std::vector<int64_t>& lengths) {
  const at::Tensor host = gathered.cpu();
  std::vector<std::string> out;
  for (size_t r = 0; r < lengths.size(); ++r) {
    const auto* begin = reinterpret_cast<const char*>(host.data_ptr<uint8_t>()) + r * record_bytes;
    out.emplace_back(begin, static_cast<size_t>(lengths[r]));
  }
  return out;
}

// One record per rank: the length (8 bytes, this host's order: every rank runs the same build)
// and then the bytes.
std::vector<std::string> all_gather_fixed(ProcessGroup& group, const std::string& mine,
                                          const c10::Device& device, size_t max_bytes) {
  if (mine.size() > max_bytes) {
    throw Error(fmt::format("rank {}: {} bytes do not fit in records of {}", group.rank(),
                            mine.size(), max_bytes));
  }
  const auto length = static_cast<int64_t>(mine.size());
  std::string record(sizeof length, '\0');
  std::memcpy(record.data(), &length, sizeof length);
  const size_t size = sizeof length + max_bytes;
  const at::Tensor input = padded(record + mine, size, device);
  auto output = at::empty({static_cast<int64_t>(size) * group.world_size()}, input.options());
  group.all_gather(output, input)->wait();
  std::vector<std::string> out;
  for (std::string& r : records(output, size, std::vector<int64_t>(group.world_size(), size))) {
    int64_t n = 0;
    std::memcpy(&n, r.data(), sizeof n);
    out.push_back(r.substr(sizeof n, static_cast<size_t>(n)));
  }
  return out;
}

}  // namespace

std::vector<std::string> all_gather_bytes(ProcessGroup& group, const std::string& mine,
                                          const c10::Device& device, size_t max_bytes) {
  if (max_bytes > 0) return all_gather_fixed(group, mine, device, max_bytes);
  const auto on_device = at::TensorOptions().device(device);
  auto length = at::full({1}, static_cast<int64_t>(mine.size()), on_device.dtype(at::kLong));
  auto all_lengths = at::empty({group.world_size()}, length.options());
  group.all_gather(all_lengths, length)->wait();
  all_lengths = all_lengths.cpu();
  const int64_t* first = all_lengths.data_ptr<int64_t>();
  const std::vector<int64_t> lengths(first, first + group.world_size());
  const auto longest = static_cast<size_t>(*std::max_element(lengths.begin(), lengths.end()));
  const at::Tensor input = padded(mine, longest, device);
  auto output = at::empty({static_cast<int64_t>(longest) * group.world_size()}, input.options());
  group.all_gather(output, input)->wait();
  return records(output, longest, lengths);
}

std::string broadcast_bytes(ProcessGroup& group, const std::string& mine, int root,
                            const c10::Device& device) {
  const auto on_device = at::TensorOptions().device(device);
  auto length = at::full({1}, static_cast<int64_t>(mine.size()), on_device.dtype(at::kLong));
  group.broadcast(length, root)->wait();
  const auto n = static_cast<size_t>(length.cpu().item<int64_t>());
  at::Tensor bytes = padded(mine.substr(0, n), n, device);
  group.broadcast(bytes, root)->wait();
  return records(bytes, n, {static_cast<int64_t>(n)}).front();
}

double all_reduce_scalar(ProcessGroup& group, double value, ReduceOp op,
                         const c10::Device& device) {
  auto t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(device));
  group.all_reduce(t, op)->wait();
  return t.cpu().item<double>();
}

bool any_rank(ProcessGroup& group, bool mine, const c10::Device& device) {
  return all_reduce_scalar(group, mine ? 1.0 : 0.0, ReduceOp::kMax, device) != 0.0;
}

at::Tensor all_gather_rows(ProcessGroup& group, const at::Tensor& row, const c10::Device& device) {
  const at::Tensor mine = row.reshape({-1}).to(device).contiguous();
  auto all = at::empty({group.world_size() * mine.numel()}, mine.options());
  group.all_gather(all, mine)->wait();
  return all.cpu().view({group.world_size(), mine.numel()});
}

std::vector<int64_t> ranks_differing(const at::Tensor& rows, int64_t reference) {
  const at::Tensor differ = rows.ne(rows[reference]).reshape({rows.size(0), -1}).any(1);
  const at::Tensor ranks = differ.nonzero().view({-1}).contiguous();
  return {ranks.data_ptr<int64_t>(), ranks.data_ptr<int64_t>() + ranks.numel()};
}

}  // namespace ddp::comm
