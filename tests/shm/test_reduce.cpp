// The shared-memory transport's reductions (comm/shm/reduce.h): closed forms for every dtype and
// operation, the fixed order over ranks, and 16-bit conversions that are LibTorch's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ddp/comm/shm/reduce.h"

namespace {

using ddp::comm::shm::DType;
using ddp::comm::shm::Op;
using ddp::comm::shm::reduce;

template <class T>
std::vector<T> reduced(DType type, Op op, const std::vector<std::vector<T>>& ranks) {
  std::vector<const void*> inputs;
  for (const auto& r : ranks) inputs.push_back(r.data());
  std::vector<T> out(ranks[0].size());
  reduce(type, op, out.data(), inputs.data(), static_cast<int>(inputs.size()), out.size());
  return out;
}

TEST(ShmReduce, SumsMinimaAndMaximaOfEveryPlainType) {
  // Rank r holds (r + 1) * (i - 3) at element i: the sum is 6 (i - 3) over 3 ranks.
  const auto ranks_of = [](auto zero) {
    using T = decltype(zero);
    std::vector<std::vector<T>> ranks(3, std::vector<T>(11));
    for (int r = 0; r < 3; ++r) {
      for (int i = 0; i < 11; ++i) ranks[r][i] = static_cast<T>((r + 1) * (i - 3));
    }
    return ranks;
  };
  const auto check = [&](auto zero, DType type) {
    using T = decltype(zero);
    const auto ranks = ranks_of(zero);
    const auto sum = reduced<T>(type, Op::kSum, ranks);
    const auto min = reduced<T>(type, Op::kMin, ranks);
    const auto max = reduced<T>(type, Op::kMax, ranks);
    for (int i = 0; i < 11; ++i) {
      EXPECT_EQ(sum[i], static_cast<T>(6 * (i - 3))) << ddp::comm::shm::dtype_name(type) << " " << i;
      EXPECT_EQ(min[i], static_cast<T>(i < 3 ? 3 * (i - 3) : i - 3)) << i;
      EXPECT_EQ(max[i], static_cast<T>(i < 3 ? i - 3 : 3 * (i - 3))) << i;
    }
  };
  check(float{}, DType::kFloat32);
  check(double{}, DType::kFloat64);
  check(int8_t{}, DType::kInt8);
  check(int16_t{}, DType::kInt16);
  check(int32_t{}, DType::kInt32);
  check(int64_t{}, DType::kInt64);
  // uint8: (i - 3) wraps below 0, as in LibTorch; only its sum is a closed form then.
  const auto u = reduced<uint8_t>(DType::kUInt8, Op::kSum, ranks_of(uint8_t{}));
  for (int i = 0; i < 11; ++i) EXPECT_EQ(u[i], static_cast<uint8_t>(6 * (i - 3)));
}

TEST(ShmReduce, IntegersWrapAndBoolsAreLogical) {
  const auto big = reduced<int32_t>(DType::kInt32, Op::kSum,
                                    {{std::numeric_limits<int32_t>::max()}, {1}});
  EXPECT_EQ(big[0], std::numeric_limits<int32_t>::min());
  const std::vector<std::vector<uint8_t>> flags = {{0, 1, 0, 1}, {0, 0, 1, 1}};
  EXPECT_EQ(reduced<uint8_t>(DType::kBool, Op::kSum, flags), (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(reduced<uint8_t>(DType::kBool, Op::kMax, flags), (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(reduced<uint8_t>(DType::kBool, Op::kMin, flags), (std::vector<uint8_t>{0, 0, 0, 1}));
}

TEST(ShmReduce, TheOutputMayBeTheFirstInputAndOneInputIsCopied) {
  // The channel's in-place all-reduce writes over rank 0's copy while reading it: the same as
  // into memory of its own, from 1 to 4 inputs, for each kind of element (plain, 16-bit, bool).
  const auto check = [](auto zero, DType type) {
    using T = decltype(zero);
    for (int n = 1; n <= 4; ++n) {
      std::vector<std::vector<T>> ranks(static_cast<size_t>(n), std::vector<T>(37));
      for (int r = 0; r < n; ++r) {
        for (int i = 0; i < 37; ++i) {
          const auto v = static_cast<uint16_t>((r + 1) * (i - 10) * 331 + r);
          ranks[static_cast<size_t>(r)][static_cast<size_t>(i)] =
              type == DType::kBool ? static_cast<T>(v % 3 == 0) : static_cast<T>(v);
        }
      }
      for (Op op : {Op::kSum, Op::kMin, Op::kMax}) {
        const std::vector<T> apart = reduced<T>(type, op, ranks);
        std::vector<std::vector<T>> over = ranks;
        std::vector<const void*> inputs;
        for (const auto& r : over) inputs.push_back(r.data());
        reduce(type, op, over[0].data(), inputs.data(), n, over[0].size());
        EXPECT_EQ(over[0], apart) << ddp::comm::shm::dtype_name(type) << " " << n;
      }
    }
  };
  check(int32_t{}, DType::kInt32);
  check(double{}, DType::kFloat64);
  check(uint16_t{}, DType::kBFloat16);  // the bits of small bfloat16 numbers and of NaNs
  check(uint8_t{}, DType::kBool);
}

TEST(ShmReduce, FloatsAreAddedInRankOrder) {
  // 1e8 + 1 - 1e8 over three ranks: in rank order (1e8 + 1) rounds to 1e8, so the sum is 0; in
  // any other order it would be 1. The order is the contract (Note [A fixed reduction order]).
  const auto sum = reduced<float>(DType::kFloat32, Op::kSum, {{1e8f}, {1.0f}, {-1e8f}});
  EXPECT_EQ(sum[0], 0.0f);
  const auto other = reduced<float>(DType::kFloat32, Op::kSum, {{1e8f}, {-1e8f}, {1.0f}});
  EXPECT_EQ(other[0], 1.0f);
}

TEST(ShmReduce, SixteenBitFloatsAreCombinedInFloat32AndRoundedOnce) {
  using ddp::comm::shm::float_to_half;
  using ddp::comm::shm::half_to_float;
  // 2048 + 1 + 1 in float16 (11 bits of mantissa): rounded after each addition, 2048 + 1 is
  // 2048 (a tie, to even) twice; in float32 the sum is 2050, which float16 holds.
  const std::vector<std::vector<uint16_t>> ranks = {
      {float_to_half(2048.0f)}, {float_to_half(1.0f)}, {float_to_half(1.0f)}};
  EXPECT_EQ(half_to_float(reduced<uint16_t>(DType::kFloat16, Op::kSum, ranks)[0]), 2050.0f);
  using ddp::comm::shm::bfloat16_to_float;
  using ddp::comm::shm::float_to_bfloat16;
  const std::vector<std::vector<uint16_t>> b = {
      {float_to_bfloat16(256.0f)}, {float_to_bfloat16(1.0f)}, {float_to_bfloat16(1.0f)}};
  EXPECT_EQ(bfloat16_to_float(reduced<uint16_t>(DType::kBFloat16, Op::kSum, b)[0]), 258.0f);
  EXPECT_EQ(bfloat16_to_float(reduced<uint16_t>(DType::kBFloat16, Op::kMax, b)[0]), 256.0f);
}

TEST(ShmReduce, HalfConversionsRoundToNearestEvenAsLibTorch) {
  using ddp::comm::shm::float_to_half;
  using ddp::comm::shm::half_to_float;
  // Every half that is a number survives the round trip through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << std::hex << h;
  }
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);              // the largest half
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);              // rounds to infinity
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -26)), 0x0000);  // below half of it
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // a tie: to even
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // a tie: to even
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);  // 0.25 * (1 + 341 / 1024)
}

TEST(ShmReduce, BFloat16ConversionsRoundToNearestEvenAsLibTorch) {
  using ddp::comm::shm::bfloat16_to_float;
  using ddp::comm::shm::float_to_bfloat16;
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3F80);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1); 1 + 3 * 2^-8 goes up.
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(float_to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(float_to_bfloat16(std::nanf("")), 0x7FC0);
  EXPECT_EQ(bfloat16_to_float(0x4049), 3.140625f);
}

}  // namespace
