// The shared-memory transport's average (comm/shm/reduce.h, Op::kAvg) against LibTorch's own
// division: the sum in rank order, then tensor.div_(n), to the bit, for every floating dtype and
// for values over many magnitudes, where the ranks' sums round (the shm backend hands its
// averages to the channel, which divides each block as it reduces it).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <vector>

#include "ddp/comm/shm/reduce.h"

namespace {

using ddp::comm::shm::DType;
using ddp::comm::shm::Op;

// Bit for bit (a NaN, from an infinity of each sign, equals itself here).
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const auto as_integers = a.element_size() == 8   ? at::kLong
                           : a.element_size() == 4 ? at::kInt
                                                   : at::kShort;
  return at::equal(a.view(as_integers), b.view(as_integers));
}

at::Tensor reduced(DType type, Op op, const std::vector<at::Tensor>& ranks) {
  std::vector<const void*> inputs;
  for (const auto& r : ranks) inputs.push_back(r.data_ptr());
  auto out = at::empty_like(ranks[0]);
  ddp::comm::shm::reduce(type, op, out.data_ptr(), inputs.data(), static_cast<int>(ranks.size()),
                         static_cast<size_t>(out.numel()));
  return out;
}

TEST(ShmAverage, IsLibTorchsSumThenDivisionToTheBit) {
  const std::vector<std::pair<at::ScalarType, DType>> types = {{at::kFloat, DType::kFloat32},
                                                               {at::kDouble, DType::kFloat64},
                                                               {at::kHalf, DType::kFloat16},
                                                               {at::kBFloat16, DType::kBFloat16}};
  at::manual_seed(7);
  for (const auto& [scalar, type] : types) {
    for (int n : {1, 2, 3, 4, 5, 7}) {
      std::vector<at::Tensor> ranks;
      for (int r = 0; r < n; ++r) {
        // Magnitudes from 2^-20 to 2^20, both signs: sums that round, quotients that do not
        // terminate in binary (a third, a fifth, a seventh); float16 overflows to infinities and
        // NaNs.
        const auto exponent = at::randint(-20, 21, {4099}, at::kDouble);
        ranks.push_back((at::randn({4099}, at::kDouble) * at::pow(2.0, exponent)).to(scalar));
      }
      auto want = reduced(type, Op::kSum, ranks);
      want.div_(n);
      const auto got = reduced(type, Op::kAvg, ranks);
      EXPECT_TRUE(same_bits(got, want)) << c10::toString(scalar) << " at " << n << " ranks";
      // An output that is the first input, as the channel's in-place pass reduces.
      auto first = ranks[0].clone();
      std::vector<at::Tensor> in_place = ranks;
      in_place[0] = first;
      std::vector<const void*> inputs;
      for (const auto& r : in_place) inputs.push_back(r.data_ptr());
      ddp::comm::shm::reduce(type, Op::kAvg, first.data_ptr(), inputs.data(), n,
                             static_cast<size_t>(first.numel()));
      EXPECT_TRUE(same_bits(first, want)) << c10::toString(scalar) << " in place at " << n;
    }
  }
}

TEST(ShmAverage, OfIntegersIsTheCallers) {
  const std::vector<int32_t> a = {1, 2}, b = {3, 4};
  std::vector<int32_t> out(2);
  const void* inputs[] = {a.data(), b.data()};
  EXPECT_ANY_THROW(ddp::comm::shm::reduce(DType::kInt32, Op::kAvg, out.data(), inputs, 2, 2));
}

}  // namespace
