#pragma once
// The element-wise reductions of the shared-memory transport (channel.h), on raw memory: the
// transport is free of LibTorch, so that its tests run under ThreadSanitizer, which LibTorch's
// uninstrumented threads would confuse.
//
// Note [A fixed reduction order]
// Every element is combined over ranks in rank order, 0 first (16-bit floats widened to float32
// and rounded once at the end): the result is a pure function of the ranks' inputs, the same bits
// on every rank and in every run, whatever the timing. Exact resume and the elastic replay rely
// on it. Gloo's ring (and MPI's tree) add in another order, so at 3 or more ranks a float sum may
// differ from theirs in the last bits; at 2 ranks a+b == b+a and the sums agree exactly.

#include <cstddef>
#include <cstdint>

namespace ddp::comm::shm {

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt8, kUInt8, kInt16, kInt32, kInt64, kBool };
// kAvg: the sum, then divided by the number of inputs as LibTorch's div_ rounds it (a float
// division; 16-bit floats: the sum rounded, widened, divided in float32, rounded again), so that
// it is the bits of a sum followed by tensor.div_(n). Floating types only: an integer average
// is the caller's (LibTorch truncates, on the signed sum).
enum class Op { kSum, kMin, kMax, kAvg };

size_t dtype_size(DType type);
const char* dtype_name(DType type);  // PyTorch's: "float32", "bfloat16", "bool", ...
bool averages(DType type);           // kAvg is defined for it: the floating types

// out[i] = inputs[0][i] op inputs[1][i] op ... op inputs[n-1][i], for i < count, in that order.
// Integers wrap as in two's complement (as LibTorch's sums do); bool: sum and max are or, min is
// and. `out` may be one of the inputs only where it is inputs[0]. A pure function. The division
// of kAvg follows each call's sum while it is still in the cache: the channel reduces a block at
// a time, so that each element is divided once, by the rank that reduced it.
void reduce(DType type, Op op, void* out, const void* const* inputs, int n, size_t count);

// 16-bit floats as LibTorch rounds them (to nearest, ties to even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

}  // namespace ddp::comm::shm
