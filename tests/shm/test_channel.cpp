// The shared-memory channel (comm/shm/channel.h): every collective against closed forms, at 2, 3
// and 4 ranks, from 0 bytes to several rounds of odd sizes; the same bits on every rank; a rank
// that never comes, breaks the channel or dies. Ranks are threads of this process on one region
// (what ThreadSanitizer checks), and forked processes on a real segment.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

// A zeroed, page-aligned region for `world` ranks, shared by threads.
struct Region {
  explicit Region(int world, size_t slot = kSlot)
      : bytes(Channel::region_bytes(world, slot)),
        memory(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)), &std::free) {
    std::memset(memory.get(), 0, bytes);
  }
  size_t bytes;
  std::unique_ptr<uint8_t, decltype(&std::free)> memory;
};

// Runs `body(channel)` on `world` threads, one rank each, and rethrows the first failure.
void run_ranks(int world, const std::function<void(Channel&)>& body, size_t slot = kSlot,
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
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Sizes in elements: none, one, odd ones below a round, and several rounds of 4 KB with a
// remainder (for 8-byte elements, 1500 is 3 rounds), and one of several MB.
const std::vector<size_t> kCounts = {0, 1, 7, 255, 1500, 4099, (size_t{3} << 20) / 4 + 3};

class ShmChannel : public ::testing::TestWithParam<int> {};

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
  // Random bits of every type (floats from a range that rounds), the same on every run: each
  // rank's result must be the reduction of all inputs, bit for bit.
  for (DType type : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                     DType::kInt8, DType::kUInt8, DType::kInt16, DType::kInt32, DType::kInt64,
                     DType::kBool}) {
    const size_t size = ddp::comm::shm::dtype_size(type);
    const size_t count = 3001;  // several rounds of 4 KB, and sliced rounds at 3 and 4 ranks
    std::vector<std::vector<uint8_t>> inputs(static_cast<size_t>(world),
                                             std::vector<uint8_t>(count * size));
    for (int r = 0; r < world; ++r) {
      uint32_t x = 12345u + static_cast<uint32_t>(r) * 7919u;
      for (size_t i = 0; i < count; ++i) {
        x = x * 1664525u + 1013904223u;
        const double v = (static_cast<double>(x >> 8) / (1 << 24) - 0.5) * 1000.0;
        uint8_t* p = inputs[r].data() + i * size;
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
    for (Op op : {Op::kSum, Op::kMin, Op::kMax}) {
      std::vector<const void*> ptrs;
      for (const auto& in : inputs) ptrs.push_back(in.data());
      std::vector<uint8_t> expected(count * size);
      ddp::comm::shm::reduce(type, op, expected.data(), ptrs.data(), world, count);
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

TEST(ShmChannelFailures, ARankThatBreaksTheChannelEndsTheOthersWaitNamingIt) {
  Region region(2);
  Channel zero(region.memory.get(), 0, 2, kSlot, milliseconds(60000));
  Channel one(region.memory.get(), 1, 2, kSlot, milliseconds(60000));
  std::thread breaker([&] {
    std::this_thread::sleep_for(milliseconds(100));
    one.abort();
  });
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> data(10000, 1.0f);
  try {
    zero.all_reduce(data.data(), data.size(), DType::kFloat32, Op::kSum);
    ADD_FAILURE() << "the all_reduce passed without rank 1";
  } catch (const ChannelError& e) {
    EXPECT_EQ(e.culprit(), 1);
    EXPECT_FALSE(e.timed_out());
    EXPECT_NE(std::string(e.what()).find("rank 1 left the shared-memory channel during all_reduce"),
              std::string::npos)
        << e.what();
  }
  breaker.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
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

// Ranks that issue different collectives (rank 1 an extra all_reduce of 3 floats while the others
// reduce 1000 doubles) all fail at the first round, naming both calls and the odd rank, long
// before the timeout; no rank reads bytes of another call.
TEST(ShmChannelFailures, RanksThatCallDifferentCollectivesAllFailNamingBothCalls) {
  const std::string expected =
      "ranks disagree: rank 1 calls all_reduce(sum, float32[3]), ranks 0 and 2 call "
      "all_reduce(sum, float64[1000])";
  Region region(3);
  std::vector<std::string> seen(3);
  std::vector<int> culprits(3, -1);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      Channel channel(region.memory.get(), r, 3, kSlot, milliseconds(20000));
      std::vector<float> odd(3, 1.0f);
      std::vector<double> data(1000, 1.0);
      try {
        if (r == 1) {
          channel.all_reduce(odd.data(), odd.size(), DType::kFloat32, Op::kSum);
        } else {
          channel.all_reduce(data.data(), data.size(), DType::kFloat64, Op::kSum);
        }
      } catch (const ChannelError& e) {
        seen[static_cast<size_t>(r)] = e.what();
        culprits[static_cast<size_t>(r)] = e.culprit();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(seen[static_cast<size_t>(r)].rfind(expected, 0), 0u) << seen[static_cast<size_t>(r)];
    EXPECT_EQ(culprits[static_cast<size_t>(r)], 1);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
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
