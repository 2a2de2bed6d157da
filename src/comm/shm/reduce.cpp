#include "ddp/comm/shm/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "ddp/common/error.h"

namespace ddp::comm::shm {
namespace {

float float_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// The combination of two values; where a comparison is false both ways (a NaN), the earlier
// rank's value stays, as std::min and std::max keep their first argument.
template <class T>
T combine(Op op, T a, T b) {
  switch (op) {
    case Op::kSum: return static_cast<T>(a + b);
    case Op::kMin: return std::min(a, b);
    case Op::kMax: return std::max(a, b);
    case Op::kAvg: break;  // never asked: an average is combined as a sum
  }
  return a;
}

// out[i] = a[i] op b[i]; `out` may be `a`.
template <class T>
void combine_into(Op op, T* out, const T* a, const T* b, size_t count) {
  switch (op) {
    case Op::kSum:
      for (size_t i = 0; i < count; ++i) out[i] = static_cast<T>(a[i] + b[i]);
      break;
    case Op::kMin:
      for (size_t i = 0; i < count; ++i) out[i] = std::min(a[i], b[i]);
      break;
    case Op::kMax:
      for (size_t i = 0; i < count; ++i) out[i] = std::max(a[i], b[i]);
      break;
    case Op::kAvg: break;  // never asked: an average is combined as a sum
  }
}

bool is_power_of_two(int n) {
  return (n & (n - 1)) == 0;
}

// out[i] = (a[i] + b[i]) / n, the sum rounded to T, then divided as LibTorch's div_ divides x / n
// in T. Where n is a power of two, x * (1/n) is the same bits as x / n (1/n is exact, and each is
// the one rounding of the same real number, subnormal results too) at a fraction of a division's
// cost. One pass with the sum's: a pass of its own over each block cost a 2 MB average at 2
// ranks half its sum's time again on this project's 2-core machine.
template <class T>
void sum_and_divide(T* out, const T* a, const T* b, size_t count, int n) {
  if (is_power_of_two(n)) {
    const T reciprocal = T(1) / static_cast<T>(n);
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<T>(a[i] + b[i]) * reciprocal;
  } else {
    const T by = static_cast<T>(n);
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<T>(a[i] + b[i]) / by;
  }
}

// Plain element types: combined in their own type, rank by rank. The loop over elements is
// inner, so the compiler vectorises it; the order over ranks stays fixed. The first two ranks
// are combined in one pass (no copy of rank 0's values first): at two ranks that is all. An
// average's division is in the last rank's pass.
template <class T>
void reduce_plain(Op op, void* out, const void* const* inputs, int n, size_t count) {
  T* o = static_cast<T*>(out);
  const auto in = [&](int r) { return static_cast<const T*>(inputs[r]); };
  if (n == 1) {
    if (o != in(0)) std::memcpy(o, in(0), count * sizeof(T));
    return;  // an average of one is its input
  }
  if (op != Op::kAvg) {
    combine_into(op, o, in(0), in(1), count);
    for (int r = 2; r < n; ++r) combine_into(op, o, o, in(r), count);
    return;
  }
  if (n == 2) return sum_and_divide(o, in(0), in(1), count, n);
  combine_into(Op::kSum, o, in(0), in(1), count);
  for (int r = 2; r < n - 1; ++r) combine_into(Op::kSum, o, o, in(r), count);
  sum_and_divide(o, o, in(n - 1), count, n);
}

// Integers wrap: summed as their unsigned type (signed overflow is undefined in C++).
template <class T, class U>
void reduce_integer(Op op, void* out, const void* const* inputs, int n, size_t count) {
  if (op == Op::kSum) {
    reduce_plain<U>(op, out, inputs, n, count);
  } else {
    reduce_plain<T>(op, out, inputs, n, count);
  }
}

void reduce_bool(Op op, void* out, const void* const* inputs, int n, size_t count) {
  auto* o = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < count; ++i) {
    bool v = static_cast<const uint8_t*>(inputs[0])[i] != 0;
    for (int r = 1; r < n; ++r) {
      const bool x = static_cast<const uint8_t*>(inputs[r])[i] != 0;
      v = op == Op::kMin ? (v && x) : (v || x);
    }
    o[i] = v ? 1 : 0;
  }
}

// 16-bit floats: each element widened, combined over the ranks in float32, rounded once. A block
// of float32 at a time keeps the inner loops over elements.
template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void reduce_16bit(Op op, void* out, const void* const* inputs, int n, size_t count) {
  constexpr size_t kBlock = 1024;
  float acc[kBlock];
  const Op combined = op == Op::kAvg ? Op::kSum : op;
  auto* o = static_cast<uint16_t*>(out);
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t len = std::min(kBlock, count - begin);
    const auto* first = static_cast<const uint16_t*>(inputs[0]) + begin;
    for (size_t i = 0; i < len; ++i) acc[i] = Widen(first[i]);
    for (int r = 1; r < n; ++r) {
      const auto* in = static_cast<const uint16_t*>(inputs[r]) + begin;
      for (size_t i = 0; i < len; ++i) acc[i] = combine(combined, acc[i], Widen(in[i]));
    }
    if (op == Op::kAvg) {  // the sum rounded, then divided as LibTorch's opmath does, rounded again
      const auto by = static_cast<float>(n);
      for (size_t i = 0; i < len; ++i) o[begin + i] = Narrow(Widen(Narrow(acc[i])) / by);
    } else {
      for (size_t i = 0; i < len; ++i) o[begin + i] = Narrow(acc[i]);
    }
  }
}

}  // namespace

size_t dtype_size(DType type) {
  switch (type) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16: return 2;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool: return 1;
  }
  return 1;
}

const char* dtype_name(DType type) {
  switch (type) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
  }
  return "?";
}

bool averages(DType type) {
  return type == DType::kFloat32 || type == DType::kFloat64 || type == DType::kFloat16 ||
         type == DType::kBFloat16;
}

void reduce(DType type, Op op, void* out, const void* const* inputs, int n, size_t count) {
  DDP_CHECK(n >= 1, "a reduction needs at least one input");
  if (count == 0) return;
  DDP_CHECK(op != Op::kAvg || averages(type),
            std::string("an average of ") + dtype_name(type) + " is the caller's");
  switch (type) {
    case DType::kFloat32: return reduce_plain<float>(op, out, inputs, n, count);
    case DType::kFloat64: return reduce_plain<double>(op, out, inputs, n, count);
    case DType::kFloat16:
      return reduce_16bit<half_to_float, float_to_half>(op, out, inputs, n, count);
    case DType::kBFloat16:
      return reduce_16bit<bfloat16_to_float, float_to_bfloat16>(op, out, inputs, n, count);
    case DType::kInt8: return reduce_integer<int8_t, uint8_t>(op, out, inputs, n, count);
    case DType::kUInt8: return reduce_plain<uint8_t>(op, out, inputs, n, count);
    case DType::kInt16: return reduce_integer<int16_t, uint16_t>(op, out, inputs, n, count);
    case DType::kInt32: return reduce_integer<int32_t, uint32_t>(op, out, inputs, n, count);
    case DType::kInt64: return reduce_integer<int64_t, uint64_t>(op, out, inputs, n, count);
    case DType::kBool: return reduce_bool(op, out, inputs, n, count);
  }
}

// The conversions below are the FP16 library's (Marat Dukhan's), which LibTorch's c10::Half uses:
// float arithmetic does the rounding, so that the result is LibTorch's to the bit.
float half_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // Normal (and infinite, NaN) halves: the exponent rebiased by a multiplication.
  const float normalized = float_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal halves: the mantissa placed under a magic exponent, the bias subtracted.
  const float denormalized = float_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const bool subnormal = two_w < (1u << 27);
  return float_from_bits(sign | bits_of(subnormal ? denormalized : normalized));
}

uint16_t float_to_half(float f) {
  // Scaling up then down rounds the mantissa to the half's precision at the right exponent.
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = bits_of(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = float_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bits_of(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float bfloat16_to_float(uint16_t b) {
  return float_from_bits(static_cast<uint32_t>(b) << 16);
}

uint16_t float_to_bfloat16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const uint32_t u = bits_of(f);
  const uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

}  // namespace ddp::comm::shm
