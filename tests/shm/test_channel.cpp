// The shared-memory channel (comm/shm/channel.h): every collective against closed forms, at 2, 3
// and 4 ranks, from 0 bytes to several rounds of odd sizes; the same bits on every rank; the
// in-place all-reduce of copies the ranks share against the staged one and the pure reduction,
// among rounds of every other kind; ranks that disagree; a rank that never comes, breaks the
// channel or dies. Ranks are threads of this process on one region (what ThreadSanitizer
// checks), and forked processes on a real segment.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/shm/channel.h"
#include "ddp/comm/shm/segment.h"

namespace {

using ddp::comm::shm::Channel;
using ddp::comm::shm::ChannelError;
using ddp::comm::shm::DType;
using ddp::comm::shm::Op;
using ddp::comm::shm::Segment;
using std::chrono::milliseconds;

constexpr size_t kSlot = 4096;  // the smallest slot: a few KB already take several rounds

// `bytes` rounded up to whole pages, at least one.
size_t whole_pages(size_t bytes) { return (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096; }

// Zeroed memory of whole pages, page-aligned.
struct Memory {
  explicit Memory(size_t at_least)
      : bytes(whole_pages(at_least)),
        memory(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)), &std::free) {
    std::memset(memory.get(), 0, bytes);
  }
  size_t bytes;
  std::unique_ptr<uint8_t, decltype(&std::free)> memory;
};

// A region for `world` ranks, shared by threads.
struct Region : Memory {
  explicit Region(int world, size_t slot = kSlot) : Memory(Channel::region_bytes(world, slot)) {}
};

// Copies that every rank can address, as a group's buffer holds them: rank r's `stride` bytes
// (whole pages) at r * stride of one allocation.
struct SharedCopies {
  SharedCopies(int world, size_t bytes)
      : world(world), stride(whole_pages(bytes)), memory(static_cast<size_t>(world) * stride) {}
  uint8_t* of(size_t rank) const { return memory.memory.get() + rank * stride; }
  // What every rank passes: the copies from byte `offset` on, rank r's at r.
  std::vector<uint8_t*> at(uint64_t offset) const {
    std::vector<uint8_t*> copies;
    for (size_t r = 0; r < static_cast<size_t>(world); ++r) copies.push_back(of(r) + offset);
    return copies;
  }
  // The Place of this rank's copy from byte `offset` on, for the all-gather and reduce-scatter
  // in place: every rank's is found at the same byte of its copy.
  Channel::Place place(int buffer, uint64_t offset) const {
    return {buffer, offset, [this](int r, int /*buffer*/, uint64_t at, size_t bytes) -> const uint8_t* {
              return at + bytes <= stride ? of(static_cast<size_t>(r)) + at : nullptr;
            }};
  }
  int world;
  size_t stride;
  Memory memory;
};

// Runs `body(channel)` on `world` threads, one rank each: what each threw (null where nothing).
std::vector<std::exception_ptr> run_ranks_catching(int world,
                                                   const std::function<void(Channel&)>& body,
                                                   size_t slot = kSlot,
                                                   milliseconds timeout = milliseconds(20000)) {
  Region region(world, slot);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        Channel channel(region.memory.get(), r, world, slot, timeout);
        body(channel);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// The same, rethrowing the first failure.
void run_ranks(int world, const std::function<void(Channel&)>& body, size_t slot = kSlot,
               milliseconds timeout = milliseconds(20000)) {
  for (auto& e : run_ranks_catching(world, body, slot, timeout)) {
    if (e) std::rethrow_exception(e);
  }
}

// Sizes in elements: none, one, odd ones below a round, and several rounds of 4 KB with a
// remainder (for 8-byte elements, 1500 is 3 rounds), and one of several MB, the largest, last.
const std::vector<size_t> kCounts = {0, 1, 7, 255, 1500, 4099, (size_t{3} << 20) / 4 + 3};

class ShmChannel : public ::testing::TestWithParam<int> {};

const std::vector<DType> kDTypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                    DType::kBFloat16, DType::kInt8,    DType::kUInt8,
                                    DType::kInt16,   DType::kInt32,   DType::kInt64,
                                    DType::kBool};
const std::vector<Op> kOps = {Op::kSum, Op::kMin, Op::kMax};

// Random bits of `type` for each of `world` ranks (floats from a range that rounds), the same on
// every run: inputs[r] is rank r's `count` elements. Each rank's result must be the reduction of
// all inputs, bit for bit.
std::vector<std::vector<uint8_t>> random_inputs(DType type, int world, size_t count) {
  const size_t size = ddp::comm::shm::dtype_size(type);
  std::vector<std::vector<uint8_t>> inputs(static_cast<size_t>(world),
                                           std::vector<uint8_t>(count * size));
  for (int r = 0; r < world; ++r) {
    uint32_t x = 12345u + static_cast<uint32_t>(r) * 7919u;
    for (size_t i = 0; i < count; ++i) {
      x = x * 1664525u + 1013904223u;
      const double v = (static_cast<double>(x >> 8) / (1 << 24) - 0.5) * 1000.0;
      uint8_t* p = inputs[static_cast<size_t>(r)].data() + i * size;
      switch (type) {
        case DType::kFloat32: { const float g = static_cast<float>(v); std::memcpy(p, &g, 4); break; }
        case DType::kFloat64: std::memcpy(p, &v, 8); break;
        case DType::kFloat16: { const uint16_t h = ddp::comm::shm::float_to_half(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
        case DType::kBFloat16: { const uint16_t h = ddp::comm::shm::float_to_bfloat16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
        case DType::kBool: *p = static_cast<uint8_t>(x >> 31); break;
        default: {  // the low bytes of x twice over (int64's high half too)
          const uint64_t bits = (uint64_t{x} << 32) | x;
          std::memcpy(p, &bits, size);
          break;
        }
      }
    }
  }
  return inputs;
}

// The pure reduction of `inputs` (count elements each), in rank order.
std::vector<uint8_t> reduced(DType type, Op op, const std::vector<std::vector<uint8_t>>& inputs,
                             size_t count) {
  std::vector<const void*> ptrs;
  for (const auto& in : inputs) ptrs.push_back(in.data());
  std::vector<uint8_t> out(count * ddp::comm::shm::dtype_size(type));
  ddp::comm::shm::reduce(type, op, out.data(), ptrs.data(), static_cast<int>(ptrs.size()), count);
  return out;
}

TEST_P(ShmChannel, AllReduceSumsMinimaAndMaximaToClosedForms) {
  const int world = GetParam();
  run_ranks(world, [&](Channel& c) {
    for (size_t count : kCounts) {
      // Rank r holds (r + 1) * (i % 97): the sum is (i % 97) * w (w + 1) / 2, exact in float.
      std::vector<float> f(count);
      std::vector<int64_t> l(count);
      for (size_t i = 0; i < count; ++i) {
        f[i] = static_cast<float>((c.rank() + 1) * static_cast<int>(i % 97));
        l[i] = (c.rank() + 1) * static_cast<int64_t>(i % 97) - 50;
      }
      std::vector<float> fmin = f;
      c.all_reduce(f.data(), count, DType::kFloat32, Op::kSum);
      c.all_reduce(fmin.data(), count, DType::kFloat32, Op::kMin);
      c.all_reduce(l.data(), count, DType::kInt64, Op::kMax);
      const int w = world;
      for (size_t i = 0; i < count; ++i) {
        const auto m = static_cast<int64_t>(i % 97);
        ASSERT_EQ(f[i], static_cast<float>(m * w * (w + 1) / 2)) << count << " " << i;
        ASSERT_EQ(fmin[i], static_cast<float>(m)) << count << " " << i;
        ASSERT_EQ(l[i], w * m - 50) << count << " " << i;
      }
    }
  });
}

TEST_P(ShmChannel, EveryDTypeIsReducedAsTheReductionOfTheInputsInRankOrder) {
  const int world = GetParam();
  for (DType type : kDTypes) {
    const size_t count = 3001;  // several rounds of 4 KB, and sliced rounds at 3 and 4 ranks
    const auto inputs = random_inputs(type, world, count);
    for (Op op : kOps) {
      const std::vector<uint8_t> expected = reduced(type, op, inputs, count);
      run_ranks(world, [&](Channel& c) {
        std::vector<uint8_t> data = inputs[static_cast<size_t>(c.rank())];
        c.all_reduce(data.data(), count, type, op);
        ASSERT_EQ(std::memcmp(data.data(), expected.data(), data.size()), 0)
            << ddp::comm::shm::dtype_name(type) << " op " << static_cast<int>(op) << " rank "
            << c.rank();
      });
    }
  }
}

TEST_P(ShmChannel, BroadcastAllGatherAllToAllAndReduceScatterMoveEveryByte) {
  const int world = GetParam();
  const auto w = static_cast<size_t>(world);
  run_ranks(world, [&](Channel& c) {
    const auto me = static_cast<size_t>(c.rank());
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{4096}, size_t{10007}}) {
      const auto byte = [](size_t from, size_t i) { return static_cast<uint8_t>(from * 31 + i * 7); };
      for (int root = 0; root < world; ++root) {
        std::vector<uint8_t> b(bytes, 0);
        if (c.rank() == root) {
          for (size_t i = 0; i < bytes; ++i) b[i] = byte(static_cast<size_t>(root), i);
        }
        c.broadcast(b.data(), bytes, root);
        for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(b[i], byte(static_cast<size_t>(root), i));
      }
      // all_gather, in place: this rank's part of the output is the input.
      std::vector<uint8_t> gathered(w * bytes);
      for (size_t i = 0; i < bytes; ++i) gathered[me * bytes + i] = byte(me, i);
      c.all_gather(gathered.data(), gathered.data() + me * bytes, bytes);
      for (size_t q = 0; q < w; ++q) {
        for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(gathered[q * bytes + i], byte(q, i)) << q;
      }
      // all_to_all: block q of rank p's input, byte(p * w + q, i), ends as block p of rank q's.
      std::vector<uint8_t> in(w * bytes), out(w * bytes);
      for (size_t q = 0; q < w; ++q) {
        for (size_t i = 0; i < bytes; ++i) in[q * bytes + i] = byte(me * w + q, i);
      }
      c.all_to_all(out.data(), in.data(), bytes);
      for (size_t p = 0; p < w; ++p) {
        for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(out[p * bytes + i], byte(p * w + me, i));
      }
    }
    for (size_t count : {size_t{0}, size_t{1}, size_t{600}, size_t{2049}}) {
      // Block q of rank p holds (p + 1) * (q + i): rank q's sum is (q + i) w (w + 1) / 2.
      std::vector<int32_t> in(w * count), out(count, -1);
      for (size_t q = 0; q < w; ++q) {
        for (size_t i = 0; i < count; ++i) in[q * count + i] = static_cast<int32_t>((me + 1) * (q + i));
      }
      c.reduce_scatter(out.data(), in.data(), count, DType::kInt32, Op::kSum);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[i], static_cast<int32_t>((me + i) * w * (w + 1) / 2)) << count << " " << i;
      }
    }
    c.barrier();
  });
}

// Where the `bytes` bytes at `a` and at `b` first differ; `bytes` where they do not.
size_t first_difference(const uint8_t* a, const uint8_t* b, size_t bytes) {
  if (bytes == 0 || std::memcmp(a, b, bytes) == 0) return bytes;  // memcmp: at memory's speed
  return static_cast<size_t>(std::mismatch(a, a + bytes, b).first - a);
}

std::string what(DType type, Op op, size_t count, int rank) {
  return std::string(ddp::comm::shm::dtype_name(type)) + " op " +
         std::to_string(static_cast<int>(op)) + " count " + std::to_string(count) + " rank " +
         std::to_string(rank);
}

// One all-reduce of InPlaceAllReduceIsTheStagedOneAndThePureReductionOnEveryCopy.
struct ReduceCase {
  size_t count;
  Op op;
  std::vector<std::vector<uint8_t>> inputs;  // rank r's at r
  std::vector<uint8_t> expected;             // their pure reduction
};

// The operations of the in-place tests for `count` elements of `type`: every one, but for the
// several MB (many blocks a slice) only a float32 sum and a bfloat16 maximum: each of them takes
// about as long under ThreadSanitizer as all the smaller counts together.
std::vector<Op> ops_for(DType type, size_t count) {
  if (count != kCounts.back()) return kOps;
  if (type == DType::kFloat32) return {Op::kSum};
  if (type == DType::kBFloat16) return {Op::kMax};
  return {};
}

// Every count of kCounts with the operations ops_for gives.
std::vector<ReduceCase> reduce_cases(DType type, int world) {
  std::vector<ReduceCase> cases;
  for (size_t count : kCounts) {
    const std::vector<Op> ops = ops_for(type, count);
    if (ops.empty()) continue;
    const auto inputs = random_inputs(type, world, count);
    for (Op op : ops) cases.push_back({count, op, inputs, reduced(type, op, inputs, count)});
  }
  return cases;
}

// The in-place all-reduce against the staged one of the same inputs (on a private copy, in the
// same channel) and the pure reduction: every rank's copy ends with their bytes. The staged one
// in rounds of a larger slot, of which several MB take a few, not thousands.
TEST_P(ShmChannel, InPlaceAllReduceIsTheStagedOneAndThePureReductionOnEveryCopy) {
  const int world = GetParam();
  for (DType type : kDTypes) {
    const size_t size = ddp::comm::shm::dtype_size(type);
    const std::vector<ReduceCase> cases = reduce_cases(type, world);
    const SharedCopies copies(world, kCounts.back() * size);
    run_ranks(world, [&](Channel& c) {
      const auto me = static_cast<size_t>(c.rank());
      uint8_t* mine = copies.of(me);
      for (const ReduceCase& rc : cases) {
        const size_t bytes = rc.count * size;
        std::copy(rc.inputs[me].begin(), rc.inputs[me].end(), mine);
        std::vector<uint8_t> staged = rc.inputs[me];
        c.all_reduce_in_place(copies.at(0).data(), rc.count, type, rc.op, 0, 0);
        c.all_reduce(staged.data(), rc.count, type, rc.op);
        const std::string at = what(type, rc.op, rc.count, c.rank());
        ASSERT_EQ(first_difference(mine, staged.data(), bytes), bytes) << at;
        ASSERT_EQ(first_difference(mine, rc.expected.data(), bytes), bytes) << at;
      }
    }, size_t{256} << 10);
  }
}

// Copies that are a part of larger ones (as DDP's buckets are of the group's buffers), from
// offsets on a cache line and off one: that part is reduced, every byte around it stays.
TEST_P(ShmChannel, InPlaceAllReduceOfAPartOfTheCopiesChangesOnlyThatPart) {
  const int world = GetParam();
  const SharedCopies copies(world, 48 << 10);
  int buffer = 0;
  for (DType type : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kUInt8}) {
    const size_t size = ddp::comm::shm::dtype_size(type);
    for (size_t count : {size_t{1}, size_t{255}, size_t{4099}}) {
      const size_t bytes = count * size;
      const auto inputs = random_inputs(type, world, count);
      const std::vector<uint8_t> expected = reduced(type, Op::kSum, inputs, count);
      for (size_t first : {size_t{0}, size_t{1}, size_t{3}, size_t{16}, size_t{1001}}) {
        const uint64_t offset = first * size;  // the elements before it
        ++buffer;
        run_ranks(world, [&](Channel& c) {
          const auto me = static_cast<size_t>(c.rank());
          uint8_t* whole = copies.of(me);
          const auto around = static_cast<uint8_t>(0xA5 + me);
          std::memset(whole, around, copies.stride);
          std::copy(inputs[me].begin(), inputs[me].end(), whole + offset);
          c.all_reduce_in_place(copies.at(offset).data(), count, type, Op::kSum, buffer, offset);
          const std::string at =
              what(type, Op::kSum, count, c.rank()) + " offset " + std::to_string(offset);
          ASSERT_EQ(first_difference(whole + offset, expected.data(), bytes), bytes) << at;
          EXPECT_EQ(std::count(whole, whole + offset, around), static_cast<ptrdiff_t>(offset))
              << at;
          EXPECT_EQ(std::count(whole + offset + bytes, whole + copies.stride, around),
                    static_cast<ptrdiff_t>(copies.stride - offset - bytes))
              << at;
        });
      }
    }
  }
}

// Rank r's `bytes` bytes for an all-gather: random, different on every rank.
std::vector<uint8_t> gather_part(int rank, int world, size_t bytes) {
  return random_inputs(DType::kUInt8, world, bytes)[static_cast<size_t>(rank)];
}

// The in-place all-gather against the staged one of the same parts (in the same channel) and
// against every rank's part: sizes from none and odd ones to several MB, this rank's part from
// private memory and from its own block of its copy (where FSDP2 puts it); every byte of every
// copy is the gathered one.
TEST_P(ShmChannel, InPlaceAllGatherIsTheStagedOneOnEveryCopy) {
  const int world = GetParam();
  const auto w = static_cast<size_t>(world);
  const SharedCopies copies(world, w * kCounts.back() * 4);
  run_ranks(world, [&](Channel& c) {
    const auto me = static_cast<size_t>(c.rank());
    for (size_t count : kCounts) {
      const size_t bytes = count * 4;
      std::vector<uint8_t> expected;
      for (int r = 0; r < world; ++r) {
        const auto part = gather_part(r, world, bytes);
        expected.insert(expected.end(), part.begin(), part.end());
      }
      const auto mine = gather_part(c.rank(), world, bytes);
      std::vector<uint8_t> staged(w * bytes);
      c.all_gather(staged.data(), mine.data(), bytes);
      for (bool from_own_block : {false, true}) {
        uint8_t* out = copies.of(me);
        std::memset(out, 0xEE, w * bytes);
        if (from_own_block) std::copy(mine.begin(), mine.end(), out + me * bytes);
        const void* in = from_own_block ? static_cast<const void*>(out + me * bytes) : mine.data();
        const Channel::Place place = copies.place(7, 0);
        c.all_gather(out, in, bytes, &place);
        const std::string at = std::to_string(bytes) + " bytes, rank " + std::to_string(me) +
                               (from_own_block ? ", from its block" : "");
        ASSERT_EQ(first_difference(out, staged.data(), w * bytes), w * bytes) << at;
        ASSERT_EQ(first_difference(out, expected.data(), w * bytes), w * bytes) << at;
      }
    }
  }, size_t{256} << 10);
}

// Rank r's input of a reduce-scatter (`world` blocks of `count`) and every rank's block `rank`.
struct ScatterCase {
  size_t count;
  Op op;
  std::vector<std::vector<uint8_t>> inputs;    // rank r's whole input at r
  std::vector<std::vector<uint8_t>> expected;  // rank q's output at q
};

// Every count of kCounts with the operations ops_for gives (one input for all of a count's).
std::vector<ScatterCase> scatter_cases(DType type, int world) {
  const size_t size = ddp::comm::shm::dtype_size(type);
  const auto w = static_cast<size_t>(world);
  std::vector<ScatterCase> cases;
  for (size_t count : kCounts) {
    const std::vector<Op> ops = ops_for(type, count);
    if (ops.empty()) continue;
    const auto inputs = random_inputs(type, world, w * count);
    const size_t block = count * size;
    for (Op op : ops) {
      ScatterCase sc{count, op, inputs, {}};
      for (size_t q = 0; q < w; ++q) {
        std::vector<std::vector<uint8_t>> blocks;
        for (const auto& in : inputs) blocks.emplace_back(in.begin() + q * block, in.begin() + (q + 1) * block);
        sc.expected.push_back(reduced(type, op, blocks, count));
      }
      cases.push_back(std::move(sc));
    }
  }
  return cases;
}

// The in-place reduce-scatter against the staged one of the same inputs and the pure reduction
// of every rank's block, in every dtype, into private memory and into this rank's own block of its
// copy (the rest of which stays as it was).
TEST_P(ShmChannel, InPlaceReduceScatterIsTheStagedOneAndThePureReduction) {
  const int world = GetParam();
  const auto w = static_cast<size_t>(world);
  for (DType type : kDTypes) {
    const size_t size = ddp::comm::shm::dtype_size(type);
    const std::vector<ScatterCase> cases = scatter_cases(type, world);
    const SharedCopies copies(world, w * kCounts.back() * size);
    run_ranks(world, [&](Channel& c) {
      const auto me = static_cast<size_t>(c.rank());
      uint8_t* mine = copies.of(me);
      for (const ScatterCase& sc : cases) {
        const size_t block = sc.count * size;
        const std::vector<uint8_t>& input = sc.inputs[me];
        std::vector<uint8_t> staged(block), out(block);
        c.reduce_scatter(staged.data(), input.data(), sc.count, type, sc.op);
        std::copy(input.begin(), input.end(), mine);
        const Channel::Place place = copies.place(2, 0);
        c.reduce_scatter(out.data(), mine, sc.count, type, sc.op, &place);
        const std::string at = what(type, sc.op, sc.count, c.rank());
        ASSERT_EQ(first_difference(out.data(), staged.data(), block), block) << at;
        ASSERT_EQ(first_difference(out.data(), sc.expected[me].data(), block), block) << at;
        ASSERT_EQ(first_difference(mine, input.data(), input.size()), input.size()) << at;
        c.reduce_scatter(mine + me * block, mine, sc.count, type, sc.op, &place);
        ASSERT_EQ(first_difference(mine + me * block, staged.data(), block), block) << at << " own block";
        ASSERT_EQ(first_difference(mine, input.data(), me * block), me * block) << at;
        const size_t after = (me + 1) * block;
        ASSERT_EQ(first_difference(mine + after, input.data() + after, input.size() - after),
                  input.size() - after)
            << at;
      }
    }, size_t{256} << 10);
  }
}

// An output that overlaps the input's copy outside this rank's block would be written while the
// others read it: refused before the round.
TEST(ShmChannelInPlace, AReduceScatterIntoAnotherRanksBlockIsRefused) {
  const SharedCopies copies(1, 64);
  Region region(1);
  Channel c(region.memory.get(), 0, 1, kSlot, milliseconds(1000));
  const Channel::Place place = copies.place(0, 0);
  EXPECT_THROW(c.reduce_scatter(copies.of(0) + 4, copies.of(0), 8, DType::kFloat32, Op::kSum, &place),
               ddp::Error);
}

// Element j of rank r at step i of InPlaceRoundsInterleaveWithEveryOtherKind is (r + 1) (i + j):
// over w ranks the sum is (i + j) w (w + 1) / 2, the minimum i + j, the maximum w (i + j).
int32_t step_value(int rank, int64_t i, size_t j) {
  return static_cast<int32_t>((rank + 1) * (i + static_cast<int64_t>(j)));
}
int32_t step_reduced(Op op, int world, int64_t i, size_t j) {
  const int64_t m = i + static_cast<int64_t>(j);
  const int64_t w = world;
  switch (op) {
    case Op::kSum: return static_cast<int32_t>(m * w * (w + 1) / 2);
    case Op::kMin: return static_cast<int32_t>(m);
    case Op::kMax: return static_cast<int32_t>(m * w);
    case Op::kAvg: break;  // of floating types only
  }
  return 0;
}

// Step i of 'g' (an all-gather in place) or 'r' (a reduce-scatter in place): `count` int32 a
// block, at a byte offset off a cache line but at 0; block q of rank r is what rank r holds at
// step i from element q * count on (step_value), so that rank q's reduction is step_reduced's.
::testing::AssertionResult step_of_blocks(Channel& c, const SharedCopies& copies, char kind,
                                          int64_t i, size_t count, Op op) {
  const auto me = static_cast<size_t>(c.rank());
  const uint64_t offset = static_cast<uint64_t>(i % 5) * 4;
  auto* blocks = reinterpret_cast<int32_t*>(copies.of(me) + offset);
  const auto w = static_cast<size_t>(c.world());
  std::vector<int32_t> out(count);
  if (kind == 'g') {
    for (size_t j = 0; j < count; ++j) blocks[me * count + j] = step_value(c.rank(), i, me * count + j);
    const Channel::Place place = copies.place(1, offset);
    c.all_gather(blocks, blocks + me * count, count * 4, &place);
  } else {
    for (size_t j = 0; j < w * count; ++j) blocks[j] = step_value(c.rank(), i, j);
    const Channel::Place place = copies.place(1, offset);
    c.reduce_scatter(out.data(), blocks, count, DType::kInt32, op, &place);
  }
  for (size_t j = 0; j < (kind == 'g' ? w : 1) * count; ++j) {
    const int32_t want = kind == 'g' ? step_value(static_cast<int>(j / count), i, j)
                                     : step_reduced(op, c.world(), i, me * count + j);
    if ((kind == 'g' ? blocks[j] : out[j]) != want) {
      return ::testing::AssertionFailure() << kind << " step " << i << " element " << j
                                           << " rank " << c.rank();
    }
  }
  return ::testing::AssertionSuccess();
}

// Step i of a kind: 's' a staged all-reduce, 'i' an in-place one, 'g' and 'r' an all-gather and a
// reduce-scatter in place, 'b' a broadcast, 'B' a barrier; of 1 to 3000 int32 (up to three rounds
// of a slot; 1 to 750 a block for 'g' and 'r') or 1 to 10000 bytes.
::testing::AssertionResult step(Channel& c, const SharedCopies& copies, char kind, int64_t i) {
  const auto me = static_cast<size_t>(c.rank());
  const size_t count = 1 + static_cast<size_t>(i * 997) % 3000;
  const Op op = kOps[static_cast<size_t>(i) % kOps.size()];
  if (kind == 'g' || kind == 'r') return step_of_blocks(c, copies, kind, i, 1 + count / 4, op);
  std::vector<int32_t> staged(count);
  int32_t* data = staged.data();
  if (kind == 'i') {
    const uint64_t offset = static_cast<uint64_t>(i % 5) * 4;  // off a cache line but at 0
    data = reinterpret_cast<int32_t*>(copies.of(me) + offset);
    for (size_t j = 0; j < count; ++j) data[j] = step_value(c.rank(), i, j);
    c.all_reduce_in_place(copies.at(offset).data(), count, DType::kInt32, op, 1, offset);
  } else if (kind == 's') {
    for (size_t j = 0; j < count; ++j) data[j] = step_value(c.rank(), i, j);
    c.all_reduce(data, count, DType::kInt32, op);
  } else if (kind == 'b') {
    const int root = static_cast<int>(i % c.world());
    const auto byte = [&](size_t j) {
      return static_cast<uint8_t>(root * 31 + static_cast<int64_t>(j) * 7 + i);
    };
    std::vector<uint8_t> b(1 + static_cast<size_t>(i * 389) % 10000);
    for (size_t j = 0; j < b.size() && c.rank() == root; ++j) b[j] = byte(j);
    c.broadcast(b.data(), b.size(), root);
    for (size_t j = 0; j < b.size(); ++j) {
      if (b[j] != byte(j))
        return ::testing::AssertionFailure() << "broadcast " << i << " byte " << j;
    }
    return ::testing::AssertionSuccess();
  } else {
    c.barrier();
    return ::testing::AssertionSuccess();
  }
  for (size_t j = 0; j < count; ++j) {
    if (data[j] != step_reduced(op, c.world(), i, j)) {
      return ::testing::AssertionFailure() << kind << " step " << i << " element " << j << ": "
                                           << data[j] << " rank " << c.rank();
    }
  }
  return ::testing::AssertionSuccess();
}

// Rounds of every kind in turn, many times over, in-place ones back to back too (the all-gather
// and reduce-scatter in place among them): they share the
// channel's round numbering, in which an in-place round counts but uses no slot. Each against
// its closed form; what ThreadSanitizer should see racing if anything does.
TEST_P(ShmChannel, InPlaceRoundsInterleaveWithEveryOtherKind) {
  const int world = GetParam();
  const SharedCopies copies(world, 4 * 751 * sizeof(int32_t) + 64);
  const std::vector<std::string> orders = {"sibgB", "iisbrg", "bisiBr", "Bgrii"};
  run_ranks(world, [&](Channel& c) {
    for (int64_t i = 0; i < 160; ++i) {
      const std::string& order = orders[static_cast<size_t>(i) % orders.size()];
      for (size_t k = 0; k < order.size(); ++k) {
        ASSERT_TRUE(step(c, copies, order[k], i * 8 + static_cast<int64_t>(k)));
      }
    }
  });
}

// Each rank's copy at a place of its own, as FSDP's units take whichever slot of its buffers is
// free on each rank: rank r's in buffer r % 2 at byte 64 r. Every rank finds the others' where
// they published them, and gathers and reduces as where all lie at one place.
TEST(ShmChannelInPlace, EachRanksCopyMayLieInAnotherBufferAtAnotherByte) {
  constexpr int kWorld = 4;
  constexpr size_t kCount = 1001;
  const SharedCopies buffers[2] = {SharedCopies(kWorld, kWorld * kCount * 4 + 256),
                                   SharedCopies(kWorld, kWorld * kCount * 4 + 256)};
  const Channel::Locate locate = [&](int r, int buffer, uint64_t offset, size_t) {
    return static_cast<const uint8_t*>(buffers[buffer].of(static_cast<size_t>(r)) + offset);
  };
  run_ranks(kWorld, [&](Channel& c) {
    const int me = c.rank();
    const uint64_t offset = 64 * static_cast<uint64_t>(me);
    const Channel::Place place{me % 2, offset, locate};
    auto* mine = reinterpret_cast<int32_t*>(buffers[me % 2].of(static_cast<size_t>(me)) + offset);
    for (size_t j = 0; j < kCount; ++j) mine[me * kCount + j] = step_value(me, 1, me * kCount + j);
    c.all_gather(mine, mine + me * kCount, kCount * 4, &place);
    for (size_t j = 0; j < kWorld * kCount; ++j) {
      ASSERT_EQ(mine[j], step_value(static_cast<int>(j / kCount), 1, j)) << me << " " << j;
    }
    for (size_t j = 0; j < kWorld * kCount; ++j) mine[j] = step_value(me, 2, j);
    std::vector<int32_t> out(kCount);
    c.reduce_scatter(out.data(), mine, kCount, DType::kInt32, Op::kSum, &place);
    for (size_t j = 0; j < kCount; ++j) {
      ASSERT_EQ(out[j], step_reduced(Op::kSum, kWorld, 2, me * kCount + j)) << me << " " << j;
    }
  });
}

// A copy that a rank cannot find (a buffer it does not map) fails every rank, naming whose copy
// and where, long before the timeout.
TEST(ShmChannelInPlace, ACopyThatCannotBeFoundFailsEveryRankNamingIt) {
  const SharedCopies copies(2, 2 * 400);
  const Channel::Locate only_buffer_0 = [&](int r, int buffer, uint64_t offset, size_t) {
    return buffer == 0 ? copies.of(static_cast<size_t>(r)) + offset : nullptr;
  };
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks_catching(2, [&](Channel& c) {
    std::vector<uint8_t> part(400, 1);
    const Channel::Place place{c.rank(), 0, only_buffer_0};
    c.all_gather(copies.of(static_cast<size_t>(c.rank())), part.data(), 400, &place);
  });
  for (const auto& error : errors) {
    ASSERT_TRUE(error != nullptr);
    try {
      std::rethrow_exception(error);
    } catch (const ChannelError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 cannot reach rank 1's memory of all_gather(400 "
                                           "bytes) in place at byte 0 of buffer 1"),
                std::string::npos)
          << e.what();
      EXPECT_EQ(e.culprit(), 1);
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Ranks 0 and 2 of 3 give the Place of their memory, rank 1 gives none (its unit found no free
// slot): every rank goes the staged way after the first round, and all get the gathered bytes
// and the reduction, again and again (the rounds stay in step), the in-place ones among them.
TEST(ShmChannelInPlace, RanksWithAndWithoutAPlaceGoTheStagedWayTogether) {
  constexpr int kWorld = 3;
  constexpr size_t kCount = 3001;  // several rounds of a slot
  const SharedCopies copies(kWorld, kWorld * kCount * 4);
  run_ranks(kWorld, [&](Channel& c) {
    const int me = c.rank();
    const auto m = static_cast<size_t>(me);
    std::vector<int32_t> plain(kWorld * kCount);
    auto* mine = me == 1 ? plain.data() : reinterpret_cast<int32_t*>(copies.of(m));
    const Channel::Place place = copies.place(0, 0);
    const Channel::Place* placed = me == 1 ? nullptr : &place;
    for (int64_t i = 0; i < 6; ++i) {
      const bool all_placed = i % 3 == 2;  // rank 1 in the copies too: in place
      int32_t* data = all_placed ? reinterpret_cast<int32_t*>(copies.of(m)) : mine;
      const Channel::Place* where = all_placed ? &place : placed;
      for (size_t j = 0; j < kCount; ++j) data[m * kCount + j] = step_value(me, i, m * kCount + j);
      c.all_gather(data, data + m * kCount, kCount * 4, where);
      for (size_t j = 0; j < kWorld * kCount; ++j) {
        ASSERT_EQ(data[j], step_value(static_cast<int>(j / kCount), i, j)) << me << " " << i << " " << j;
      }
      for (size_t j = 0; j < kWorld * kCount; ++j) data[j] = step_value(me, i, j);
      std::vector<int32_t> out(kCount);
      c.reduce_scatter(out.data(), data, kCount, DType::kInt32, Op::kMax, where);
      for (size_t j = 0; j < kCount; ++j) {
        ASSERT_EQ(out[j], step_reduced(Op::kMax, kWorld, i, m * kCount + j)) << me << " " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(World, ShmChannel, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(ShmChannelFailures, ARankThatNeverComesIsNamedAtTheTimeout) {
  Region region(3);
  Channel zero(region.memory.get(), 0, 3, kSlot, milliseconds(300));
  Channel one(region.memory.get(), 1, 3, kSlot, milliseconds(300));
  // Both wait for rank 2; whichever finds it first breaks the channel, and the other, unless it
  // found it too, gives that reason and who found it.
  std::string seen_by_one;
  std::thread first([&] {
    try {
      one.barrier();
    } catch (const ChannelError& e) {
      seen_by_one = e.what();
    }
  });
  const auto start = std::chrono::steady_clock::now();
  std::string seen_by_zero;
  try {
    zero.barrier();
    ADD_FAILURE() << "rank 2 never came, yet the barrier passed";
  } catch (const ChannelError& e) {
    seen_by_zero = e.what();
    EXPECT_EQ(e.culprit(), 2);
    EXPECT_TRUE(e.timed_out());
  }
  first.join();
  const std::string timeout = "rank 2 did not arrive at barrier() within 0.3 s";
  // Each found it, or has the other's finding (both may time out at once, each on its own).
  EXPECT_TRUE(seen_by_zero == timeout || seen_by_zero == timeout + " (found by rank 1)")
      << seen_by_zero;
  EXPECT_TRUE(seen_by_one == timeout || seen_by_one == timeout + " (found by rank 0)")
      << seen_by_one;
  EXPECT_TRUE(seen_by_zero == timeout || seen_by_one == timeout) << "nobody found it";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  // The channel stays broken: the next collective fails at once.
  EXPECT_THROW(zero.barrier(), ChannelError);
}

// Rank 1 of 2 breaks the channel (abort) while rank 0 waits in `collective`, which `described`
// describes: rank 0's wait ends at once, naming rank 1 and the collective.
void expect_the_breaker_named(const std::function<void(Channel&)>& collective,
                              const std::string& described) {
  Region region(2);
  Channel zero(region.memory.get(), 0, 2, kSlot, milliseconds(60000));
  Channel one(region.memory.get(), 1, 2, kSlot, milliseconds(60000));
  std::thread breaker([&] {
    std::this_thread::sleep_for(milliseconds(100));
    one.abort();
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    collective(zero);
    ADD_FAILURE() << described << " passed without rank 1";
  } catch (const ChannelError& e) {
    EXPECT_EQ(e.culprit(), 1);
    EXPECT_FALSE(e.timed_out());
    EXPECT_EQ(std::string(e.what()), "rank 1 left the shared-memory channel during " + described);
  }
  breaker.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(ShmChannelFailures, ARankThatBreaksTheChannelEndsTheOthersWaitNamingIt) {
  std::vector<float> data(10000, 1.0f);
  expect_the_breaker_named(
      [&](Channel& c) { c.all_reduce(data.data(), data.size(), DType::kFloat32, Op::kSum); },
      "all_reduce(sum, float32[10000])");
}

TEST(ShmChannelFailures, ARankThatBreaksTheChannelDuringAnInPlaceAllReduceIsNamed) {
  const SharedCopies copies(2, 10000 * sizeof(float));
  expect_the_breaker_named(
      [&](Channel& c) {
        c.all_reduce_in_place(copies.at(64).data(), 9000, DType::kFloat32, Op::kSum, 3, 64);
      },
      "all_reduce(sum, float32[9000]) in place at byte 64 of buffer 3");
}

TEST(ShmChannelFailures, ARankThatBreaksTheChannelDuringAnInPlaceAllGatherIsNamed) {
  const SharedCopies copies(2, 2 * 4000);
  std::vector<uint8_t> part(4000, 1);
  expect_the_breaker_named(
      [&](Channel& c) {
        const Channel::Place place = copies.place(5, 0);
        c.all_gather(copies.of(static_cast<size_t>(c.rank())), part.data(), 4000, &place);
      },
      "all_gather(4000 bytes) in place at byte 0 of buffer 5");
}

// Many short lives: 6 ranks (more than this machine's cores) each leave the channel as their
// group does (abort) right after their last collective, hundreds of times; a rank still waiting
// in that collective completes it (the others' leaving is no failure of a round they all came to).
TEST(ShmChannelFailures, RanksLeavingRightAfterTheirLastCollectiveFailNoOther) {
  constexpr int kWorld = 6;
  for (int life = 0; life < 300; ++life) {
    run_ranks(kWorld, [&](Channel& c) {
      std::vector<int32_t> v(7, c.rank() + 1);
      c.all_reduce(v.data(), v.size(), DType::kInt32, Op::kSum);
      c.barrier();
      c.abort();
      if (v.front() != kWorld * (kWorld + 1) / 2) throw std::runtime_error("a wrong sum");
    });
  }
}

// A segment's name under /dev/shm, for the checks that nothing is left.
bool in_dev_shm(const std::string& name) {
  return std::filesystem::exists("/dev/shm" + name);
}

std::string unique_name(const char* what) {
  return "/ddp-test-" + std::string(what) + "-" + std::to_string(::getpid());
}

// What each of `world` ranks running `body` threw: its ChannelError's message and the rank it
// names ("" and -1 where it threw nothing).
struct Thrown {
  std::string what;
  int culprit = -1;
};
std::vector<Thrown> channel_errors(int world, const std::function<void(Channel&)>& body) {
  std::vector<Thrown> thrown;
  for (const auto& error : run_ranks_catching(world, body)) {
    thrown.emplace_back();
    try {
      if (error) std::rethrow_exception(error);
    } catch (const ChannelError& e) {
      thrown.back() = {e.what(), e.culprit()};
    }
  }
  return thrown;
}

// Every rank of `world` running `body` fails saying `expected`, naming `culprit`, long before
// the timeout.
void expect_all_fail(int world, const std::function<void(Channel&)>& body,
                     const std::string& expected, int culprit) {
  const auto start = std::chrono::steady_clock::now();
  for (const Thrown& t : channel_errors(world, body)) {
    EXPECT_EQ(t.what, expected);
    EXPECT_EQ(t.culprit, culprit);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Ranks that issue different collectives (rank 1 an extra all_reduce of 3 floats while the others
// reduce 1000 doubles) all fail at the first round, naming both calls and the odd rank, long
// before the timeout; no rank reads bytes of another call.
TEST(ShmChannelFailures, RanksThatCallDifferentCollectivesAllFailNamingBothCalls) {
  expect_all_fail(3, [](Channel& c) {
    std::vector<float> odd(3, 1.0f);
    std::vector<double> data(1000, 1.0);
    if (c.rank() == 1) {
      c.all_reduce(odd.data(), odd.size(), DType::kFloat32, Op::kSum);
    } else {
      c.all_reduce(data.data(), data.size(), DType::kFloat64, Op::kSum);
    }
  }, "ranks disagree: rank 1 calls all_reduce(sum, float32[3]), ranks 0 and 2 call "
     "all_reduce(sum, float64[1000])", 1);
}

// An in-place all-reduce is a call of its own: against the staged one of the same count, or of
// the copies at another offset or of another buffer, every rank fails at once naming both calls,
// and no copy changes.
TEST(ShmChannelFailures, InPlaceAllReducesThatDifferFromTheOthersCallsAllFailNamingBoth) {
  const SharedCopies copies(3, 1000 * sizeof(float) + 64);
  for (size_t r = 0; r < 3; ++r) std::memset(copies.of(r), static_cast<int>(r + 1), copies.stride);
  // The call of `odd` differs: the staged one, or in place at `offset` of `buffer`.
  const auto with = [&](int odd, bool staged, uint64_t offset, int buffer) {
    return [=, &copies](Channel& c) {
      std::vector<float> data(1000, 1.0f);
      if (c.rank() == odd && staged) {
        c.all_reduce(data.data(), data.size(), DType::kFloat32, Op::kSum);
      } else if (c.rank() == odd) {
        c.all_reduce_in_place(copies.at(offset).data(), 1000, DType::kFloat32, Op::kSum, buffer,
                              offset);
      } else {
        c.all_reduce_in_place(copies.at(0).data(), 1000, DType::kFloat32, Op::kSum, 0, 0);
      }
    };
  };
  const std::string in_place = "all_reduce(sum, float32[1000]) in place at byte 0 of buffer 0";
  expect_all_fail(
      3, with(1, true, 0, 0),
      "ranks disagree: rank 1 calls all_reduce(sum, float32[1000]), ranks 0 and 2 call " + in_place,
      1);
  expect_all_fail(
      3, with(2, false, 64, 0),
      "ranks disagree: rank 2 calls all_reduce(sum, float32[1000]) in place at byte 64 of "
      "buffer 0, ranks 0 and 1 call " +
          in_place,
      2);
  expect_all_fail(
      3, with(0, false, 0, 1),
      "ranks disagree: rank 0 calls all_reduce(sum, float32[1000]) in place at byte 0 of "
      "buffer 1, ranks 1 and 2 call " +
          in_place,
      0);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(std::count(copies.of(r), copies.of(r) + copies.stride, r + 1),
              static_cast<ptrdiff_t>(copies.stride))
        << r;
  }
}

// An all-gather whose ranks' counts differ (one of them staged), and a reduce-scatter in place of
// another count at another byte: every rank fails at once naming both calls, and no copy changes
// but for the parts the all-gather's ranks put in their own blocks before they met.
TEST(ShmChannelFailures, GathersAndScattersOfOtherSizesAllFailNamingBoth) {
  const SharedCopies copies(3, 3 * 400);
  for (size_t r = 0; r < 3; ++r) std::memset(copies.of(r), static_cast<int>(r + 1), copies.stride);
  expect_all_fail(3, [&](Channel& c) {
    std::vector<uint8_t> part(400, 9), out(1200);
    const Channel::Place place = copies.place(0, 0);
    if (c.rank() == 1) {
      c.all_gather(out.data(), part.data(), 399);
    } else {
      c.all_gather(copies.of(static_cast<size_t>(c.rank())), part.data(), part.size(), &place);
    }
  }, "ranks disagree: rank 1 calls all_gather(399 bytes), ranks 0 and 2 call all_gather(400 "
     "bytes) in place at byte 0 of buffer 0", 1);
  for (size_t r : {size_t{0}, size_t{2}}) {
    EXPECT_EQ(std::count(copies.of(r) + r * 400, copies.of(r) + (r + 1) * 400, 9), 400) << r;
    std::memset(copies.of(r) + r * 400, static_cast<int>(r + 1), 400);
  }
  expect_all_fail(3, [&](Channel& c) {
    std::vector<float> out(100);
    const uint64_t offset = c.rank() == 2 ? 64 : 0;
    const Channel::Place place = copies.place(0, offset);
    c.reduce_scatter(out.data(), copies.of(static_cast<size_t>(c.rank())) + offset,
                     c.rank() == 2 ? 99 : 100, DType::kFloat32, Op::kSum, &place);
  }, "ranks disagree: rank 2 calls reduce_scatter(sum, float32[99]) in place at byte 64 of "
     "buffer 0, ranks 0 and 1 call reduce_scatter(sum, float32[100]) in place at byte 0 of "
     "buffer 0", 2);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(std::count(copies.of(r), copies.of(r) + copies.stride, r + 1),
              static_cast<ptrdiff_t>(copies.stride))
        << r;
  }
}

TEST(ShmChannelFailures, CallsAreDescribedAndGroupedByRank) {
  using Call = Channel::Call;
  using Kind = Channel::Kind;
  const Call bcast{Kind::kBroadcast, DType::kUInt8, Op::kSum, 0, 40};
  const Call gather{Kind::kAllGather, DType::kUInt8, Op::kSum, -1, 40};
  EXPECT_EQ(Channel::describe(bcast), "broadcast(root 0, 40 bytes)");
  EXPECT_EQ(Channel::describe(Call{}), "barrier()");
  EXPECT_EQ(Channel::describe({Kind::kReduceScatter, DType::kBFloat16, Op::kMax, -1, 5}),
            "reduce_scatter(max, bfloat16[5])");
  EXPECT_FALSE(Channel::mismatch({gather, gather, gather}).has_value());
  // Two ranks, one each: the later is named. Four: the lone one, wherever it is.
  auto two = Channel::mismatch({bcast, gather});
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->first, "rank 1 calls all_gather(40 bytes), rank 0 calls broadcast(root 0, 40 bytes)");
  EXPECT_EQ(two->second, 1);
  auto four = Channel::mismatch({bcast, bcast, gather, bcast});
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ(four->first,
            "rank 2 calls all_gather(40 bytes), ranks 0, 1 and 3 call broadcast(root 0, 40 bytes)");
  EXPECT_EQ(four->second, 2);
  // A different root is a different call.
  const Call other_root{Kind::kBroadcast, DType::kUInt8, Op::kSum, 1, 40};
  EXPECT_EQ(Channel::mismatch({bcast, other_root, bcast})->second, 1);
  // In place: `root` is the buffer. Not the staged call of the same count; another offset or
  // buffer is another call.
  const Call in_place{Kind::kAllReduceInPlace, DType::kFloat32, Op::kSum, 2, 1000, 4100};
  EXPECT_EQ(Channel::describe(in_place),
            "all_reduce(sum, float32[1000]) in place at byte 4100 of buffer 2");
  const Call staged{Kind::kAllReduce, DType::kFloat32, Op::kSum, -1, 1000};
  EXPECT_EQ(Channel::mismatch({in_place, staged, in_place})->first,
            "rank 1 calls all_reduce(sum, float32[1000]), ranks 0 and 2 call all_reduce(sum, "
            "float32[1000]) in place at byte 4100 of buffer 2");
  Call moved = in_place;
  moved.offset = 4164;
  EXPECT_EQ(Channel::mismatch({in_place, in_place, moved})->second, 2);
  Call other_buffer = in_place;
  other_buffer.root = 3;
  EXPECT_EQ(Channel::mismatch({other_buffer, in_place, in_place})->second, 0);
  // An average (the channel divides it) is not a sum.
  Call averaged = in_place;
  averaged.op = Op::kAvg;
  EXPECT_EQ(Channel::mismatch({in_place, averaged})->first,
            "rank 1 calls all_reduce(avg, float32[1000]) in place at byte 4100 of buffer 2, rank 0 "
            "calls all_reduce(sum, float32[1000]) in place at byte 4100 of buffer 2");
  // An all-gather or reduce-scatter given a Place: where this rank's memory lies, which the
  // ranks need not share.
  const Call placed_gather{Kind::kAllGather, DType::kUInt8, Op::kSum, 4, 64, 128};
  EXPECT_EQ(Channel::describe(placed_gather), "all_gather(64 bytes) in place at byte 128 of buffer 4");
  EXPECT_EQ(Channel::describe({Kind::kReduceScatter, DType::kBFloat16, Op::kMax, 1, 5, 0}),
            "reduce_scatter(max, bfloat16[5]) in place at byte 0 of buffer 1");
  Call elsewhere = placed_gather;
  elsewhere.root = 5;
  elsewhere.offset = 0;
  const Call staged_gather{Kind::kAllGather, DType::kUInt8, Op::kSum, -1, 64};
  EXPECT_FALSE(Channel::mismatch({placed_gather, elsewhere, staged_gather}).has_value());
  Call fewer = placed_gather;
  fewer.count = 63;
  EXPECT_EQ(Channel::mismatch({placed_gather, fewer, staged_gather})->second, 1);
  EXPECT_EQ(Channel::describe({Kind::kAllReduceInPlace, DType::kInt8, Op::kMin,
                               2 * Channel::kGroupUp + 3, 9, 64}),
            "all_reduce(min, int8[9]) in place at byte 64 of buffer 3 (2 groups up)");
}

TEST(ShmSegment, IsCreatedOpenedUnlinkedAndNamesWhatFailed) {
  const std::string name = unique_name("segment");
  Segment created = Segment::create(name, 8192);
  EXPECT_TRUE(in_dev_shm(name));
  static_cast<uint8_t*>(created.data())[8191] = 42;
  {
    Segment opened = Segment::open(name, 8192);
    EXPECT_EQ(static_cast<uint8_t*>(opened.data())[8191], 42);
  }
  try {
    Segment::create(name, 8192);
    ADD_FAILURE() << "a second create of " << name << " passed";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(name + ": shm_open failed: File exists"),
              std::string::npos)
        << e.what();
  }
  Segment::remove(name);
  Segment::remove(name);  // idempotent
  EXPECT_FALSE(in_dev_shm(name));
  EXPECT_EQ(static_cast<uint8_t*>(created.data())[8191], 42);  // still mapped
  try {
    Segment::open(name, 8192);
    ADD_FAILURE() << "an unlinked segment was opened";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
}

TEST(ShmSegment, MoreThanDevShmHoldsFailsAtCreationAndLeavesNoName) {
  const std::string name = unique_name("huge");
  try {
    Segment::create(name, size_t{1} << 44);  // 16 TiB
    ADD_FAILURE() << "16 TiB of shared memory were reserved";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("reserving 17592186044416 bytes failed"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(in_dev_shm(name));
}

// Two processes on a real segment: the child is rank 1. `child` runs there; its exit code is 0
// when it did what it should.
pid_t fork_rank(const std::string& name, size_t bytes, const std::function<int(Channel&)>& child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 3;
    try {
      Segment segment = Segment::open(name, bytes);
      Channel channel(segment.data(), 1, 2, kSlot, milliseconds(20000));
      code = child(channel);
    } catch (...) {
      code = 4;
    }
    ::_exit(code);
  }
  return pid;
}

TEST(ShmProcesses, TwoProcessesReduceThroughASegmentThatIsGoneFromDevShm) {
  const std::string name = unique_name("processes");
  const size_t bytes = Channel::region_bytes(2, kSlot);
  Segment segment = Segment::create(name, bytes);
  const pid_t child = fork_rank(name, bytes, [](Channel& c) {
    std::vector<double> v(5000, 2.5);
    c.all_reduce(v.data(), v.size(), DType::kFloat64, Op::kSum);
    c.barrier();  // after the parent's unlink
    return v.front() == 4.0 && v.back() == 4.0 ? 0 : 1;
  });
  Channel channel(segment.data(), 0, 2, kSlot, milliseconds(20000));
  std::vector<double> v(5000, 1.5);
  channel.all_reduce(v.data(), v.size(), DType::kFloat64, Op::kSum);
  Segment::remove(name);  // both have mapped it
  channel.barrier();
  EXPECT_EQ(v[4999], 4.0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(in_dev_shm(name));
}

TEST(ShmProcesses, ARankKilledMidCollectiveIsNamedWellBeforeTheTimeout) {
  const std::string name = unique_name("killed");
  const size_t bytes = Channel::region_bytes(2, kSlot);
  Segment segment = Segment::create(name, bytes);
  const pid_t child = fork_rank(name, bytes, [](Channel& c) {
    c.barrier();
    ::pause();  // never comes to the all_reduce: killed there
    return 0;
  });
  Channel channel(segment.data(), 0, 2, kSlot, milliseconds(60000));
  channel.barrier();
  Segment::remove(name);
  // The parent reaps the child as a launcher does: a zombie would still answer kill(pid, 0).
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(200));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
  });
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> v(100, 1.0f);
  try {
    channel.all_reduce(v.data(), v.size(), DType::kFloat32, Op::kSum);
    ADD_FAILURE() << "the all_reduce passed without rank 1";
  } catch (const ChannelError& e) {
    EXPECT_EQ(e.culprit(), 1);
    EXPECT_EQ(std::string(e.what()),
              "rank 1 (process " + std::to_string(child) + ") ended during all_reduce(sum, float32[100])");
  }
  killer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_FALSE(in_dev_shm(name));
}

}  // namespace
