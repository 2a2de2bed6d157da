// PowerSGD, following PyTorch's powerSGD_hook step for step (the names in comments are its): a
// test checks the two agree to 1e-5 on the same gradients, random initial Q's included.
#include "ddp/core/powersgd.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "ddp/common/error.h"

namespace ddp::core {
namespace {

// A bucket's gradients split as the hook compresses them.
struct Split {
  // n x m views into the buffer, grouped by shape in order of first appearance (PyTorch's
  // shape_to_tensors): the order of the P's and Q's in memory and of the random draws.
  std::vector<torch::Tensor> compress;
  std::vector<int64_t> ranks;               // per matrix, min(n, m, rank)
  std::vector<torch::Tensor> uncompressed;  // views into the buffer, all-reduced as they are
  int64_t p_numel = 0;
  int64_t q_numel = 0;
  int64_t numel_before = 0;  // total_numel_before_compression's share
  int64_t numel_after = 0;
};

Split split_gradients(const std::vector<torch::Tensor>& gradients, const PowerSGDOptions& options) {
  Split split;
  std::vector<torch::Tensor> matrices;
  for (const auto& gradient : gradients) {
    const int64_t n = gradient.dim() == 0 ? 1 : gradient.size(0);
    auto matrix = gradient.view({n, -1});
    const int64_t m = matrix.size(1);
    const int64_t r = std::min({n, m, options.matrix_approximation_rank()});
    const int64_t compressed = (n + m) * r;
    split.numel_before += n * m;
    if (static_cast<double>(compressed) * options.min_compression_rate() <
        static_cast<double>(n * m)) {
      matrices.push_back(matrix);
      split.numel_after += compressed;
    } else {
      split.uncompressed.push_back(gradient);
      split.numel_after += n * m;
    }
  }
  // Stable grouping by shape, first appearance first.
  std::vector<bool> taken(matrices.size(), false);
  for (size_t i = 0; i < matrices.size(); ++i) {
    for (size_t j = i; j < matrices.size(); ++j) {
      if (taken[j] || matrices[j].sizes() != matrices[i].sizes()) continue;
      taken[j] = true;
      const int64_t n = matrices[j].size(0);
      const int64_t m = matrices[j].size(1);
      const int64_t r = std::min({n, m, options.matrix_approximation_rank()});
      split.compress.push_back(matrices[j]);
      split.ranks.push_back(r);
      split.p_numel += n * r;
      split.q_numel += m * r;
    }
  }
  return split;
}

// Per matrix of `split`, its P (n x r) and Q (m x r) as views into the bucket's memory.
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> low_rank_views(
    const Split& split, const torch::Tensor& p_memory, const torch::Tensor& q_memory) {
  std::vector<torch::Tensor> ps;
  std::vector<torch::Tensor> qs;
  int64_t p_offset = 0;
  int64_t q_offset = 0;
  for (size_t i = 0; i < split.compress.size(); ++i) {
    const int64_t n = split.compress[i].size(0);
    const int64_t m = split.compress[i].size(1);
    const int64_t r = split.ranks[i];
    ps.push_back(p_memory.narrow(0, p_offset, n * r).view({n, r}));
    qs.push_back(q_memory.narrow(0, q_offset, m * r).view({m, r}));
    p_offset += n * r;
    q_offset += m * r;
  }
  return {ps, qs};
}

torch::Tensor concatenated(const std::vector<torch::Tensor>& tensors,
                           const torch::TensorOptions& options) {
  if (tensors.empty()) return torch::empty({0}, options);
  std::vector<torch::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return torch::cat(flat);
}

void unpack(const torch::Tensor& memory, const std::vector<torch::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& t : tensors) {
    t.copy_(memory.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

// Error feedback's first half: adds what compression lost last time to the bucket (a fresh
// bucket starts from no error) and returns the copy the new loss will be measured against.
torch::Tensor add_error(std::map<size_t, torch::Tensor>& errors, size_t index,
                        torch::Tensor& input) {
  auto [error, fresh] = errors.try_emplace(index);
  if (fresh) {
    error->second = torch::zeros_like(input);
  } else {
    input.add_(error->second);
  }
  return input.clone();
}

// PyTorch's unpack_uncompressed_tensors_and_allreduce_ps: the average of the uncompressed
// tensors back into the bucket, then the sum of the P's (which need no division: they are
// normalised next).
torch::Tensor unpack_and_all_reduce_ps(comm::ProcessGroup& group, torch::Tensor reduced,
                                       const Split& split, torch::Tensor p_memory) {
  unpack(reduced.div_(group.world_size()), split.uncompressed);
  group.all_reduce(p_memory, comm::ReduceOp::kSum)->wait();
  return p_memory;
}

// PyTorch's compute_qs: the summed P's orthonormalised, each Q = M^T P, then the sum of the Q's.
torch::Tensor compute_qs(comm::ProcessGroup& group, const Split& split,
                         const std::vector<torch::Tensor>& ps, std::vector<torch::Tensor>& qs,
                         torch::Tensor q_memory, double epsilon) {
  for (const auto& p : ps) orthogonalize(p, epsilon);
  for (size_t i = 0; i < qs.size(); ++i) at::mm_out(qs[i], split.compress[i].t(), ps[i]);
  group.all_reduce(q_memory, comm::ReduceOp::kSum)->wait();
  return q_memory;
}

// Fresh Q's: the same random values on every rank, from a CPU generator seeded with `seed`.
void randomize(std::vector<torch::Tensor>& qs, uint64_t seed, c10::ScalarType dtype) {
  auto generator = at::detail::createCPUGenerator(seed);
  for (auto& q : qs) q.copy_(at::randn(q.sizes(), generator, at::TensorOptions().dtype(dtype)));
}

}  // namespace

void orthogonalize(torch::Tensor matrix, double epsilon) {
  const int64_t cols = matrix.size(1);
  const auto dtype = matrix.scalar_type();
  if (cols > 2 && dtype != at::kHalf && dtype != at::kBFloat16) {
    matrix.copy_(std::get<0>(at::linalg_qr(matrix)));
    return;
  }
  for (int64_t i = 0; i < cols; ++i) {  // Gram-Schmidt
    auto col = matrix.narrow(1, i, 1);
    if (epsilon == 0) {
      col.div_(col.norm());
    } else {
      col.div_(col.norm() + epsilon);
    }
    if (i + 1 < cols) {
      auto rest = matrix.narrow(1, i + 1, cols - i - 1);
      rest.sub_((col * rest).sum(0, /*keepdim=*/true) * col);
    }
  }
}

PowerSGDState::PowerSGDState(std::shared_ptr<comm::ProcessGroup> group, PowerSGDOptions options)
    : group_(std::move(group)), options_(options), rng_(options.random_seed()) {
  DDP_CHECK(group_ != nullptr, "PowerSGDState needs a process group");
  if (options_.matrix_approximation_rank() < 1) {
    throw InputError(fmt::format("PowerSGD: matrix_approximation_rank must be at least 1, got {}",
                                 options_.matrix_approximation_rank()));
  }
  if ((options_.use_error_feedback() || options_.warm_start()) &&
      options_.start_powerSGD_iter() <= 1) {
    throw InputError(fmt::format(
        "PowerSGD: start_powerSGD_iter must be above 1 with error feedback or warm start (got "
        "{}): the buckets are rebuilt after the first iteration, which would mix up the "
        "per-bucket state",
        options_.start_powerSGD_iter()));
  }
}

void PowerSGDState::maybe_increase_iter(const GradBucket& bucket) {
  if (bucket.is_last()) ++iter_;
}

uint64_t PowerSGDState::next_seed() {
  // numpy's legacy randint(high) for high < 2**32: 32-bit draws masked to the smallest
  // all-ones mask covering high - 1 (2**30 - 1 here), redrawn until within range.
  constexpr uint32_t kHigh = 1000000000;
  constexpr uint32_t kMask = (uint32_t{1} << 30) - 1;
  uint32_t value = 0;
  do {
    value = static_cast<uint32_t>(rng_()) & kMask;
  } while (value >= kHigh);
  return value;
}

FuturePtr powersgd_hook(PowerSGDState& state, GradBucket& bucket) {
  auto& group = state.group();
  const auto& options = state.options();
  if (state.iter_ < options.start_powerSGD_iter()) {
    state.maybe_increase_iter(bucket);
    return allreduce_hook(group, bucket);
  }
  auto input = bucket.buffer();
  const size_t index = bucket.index();
  // Error feedback: what compression loses is input_copy - result.
  const auto input_copy =
      options.use_error_feedback() ? add_error(state.error_, index, input) : torch::Tensor();
  auto split = split_gradients(bucket.gradients(), options);
  state.numel_before_ += split.numel_before;
  state.numel_after_ += split.numel_after;
  auto uncompressed = concatenated(split.uncompressed, input.options());

  const bool fresh_q = !options.warm_start() || state.p_memory_.count(index) == 0;
  if (fresh_q) {
    state.p_memory_[index] = torch::empty({split.p_numel}, input.options());
    state.q_memory_[index] = torch::empty({split.q_numel}, input.options());
  }
  std::vector<torch::Tensor> ps;
  std::vector<torch::Tensor> qs;
  std::tie(ps, qs) = low_rank_views(split, state.p_memory_[index], state.q_memory_[index]);
  if (fresh_q) randomize(qs, state.next_seed(), input.scalar_type());
  for (auto& q : qs) orthogonalize(q, options.orthogonalization_epsilon());
  for (size_t i = 0; i < ps.size(); ++i) at::mm_out(ps[i], split.compress[i], qs[i]);

  return Future::of(group.all_reduce(uncompressed, comm::ReduceOp::kSum), uncompressed)
      ->then([&state, &group, index, split](torch::Tensor reduced) {
        return unpack_and_all_reduce_ps(group, reduced, split, state.p_memory_[index]);
      })
      ->then([&state, &group, index, split, ps, qs](torch::Tensor) mutable {
        return compute_qs(group, split, ps, qs, state.q_memory_[index],
                          state.options().orthogonalization_epsilon());
      })
      ->then([&state, &group, index, split, ps, qs, input, input_copy,
              is_last = bucket.is_last()](torch::Tensor q_memory) mutable {
        q_memory.div_(group.world_size());
        for (size_t i = 0; i < ps.size(); ++i) at::mm_out(split.compress[i], ps[i], qs[i].t());
        if (state.options().use_error_feedback()) state.error_[index] = input_copy - input;
        if (!state.options().warm_start()) {
          state.p_memory_.clear();
          state.q_memory_.clear();
        }
        if (is_last) ++state.iter_;
        return input;
      });
}

}  // namespace ddp::core
