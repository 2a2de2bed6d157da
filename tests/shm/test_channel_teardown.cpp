// A collective that every rank arrived at completes, even where a rank leaves the channel (its
// group breaks it as it goes) while another still waits: in a test build of the channel that
// holds the waiter between its look at the counters and its look at the broken flag, the one
// moment where a waiter could take that leaving for a failure.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ddp/comm/shm/channel.h"

namespace {

using ddp::comm::shm::Channel;
using std::chrono::milliseconds;

constexpr size_t kSlot = 4096;

// Where the test holds rank 0 the first time it gets between the two looks.
struct Hold {
  std::mutex mutex;
  std::condition_variable changed;
  bool rank_zero_held = false;  // rank 0 looked at the counters, rank 1 not there yet
  bool rank_one_left = false;   // rank 1 completed the barrier and broke the channel
};
Hold* g_hold = nullptr;

}  // namespace

namespace ddp::testing {
void between_looks(int rank) {
  if (g_hold == nullptr || rank != 0) return;
  std::unique_lock<std::mutex> lock(g_hold->mutex);
  if (g_hold->rank_zero_held) return;  // only the first time
  g_hold->rank_zero_held = true;
  g_hold->changed.notify_all();
  g_hold->changed.wait_for(lock, std::chrono::seconds(10), [] { return g_hold->rank_one_left; });
}
}  // namespace ddp::testing

namespace {

TEST(ShmChannelTeardown, ARankThatLeavesRightAfterTheLastRoundDoesNotFailTheOthers) {
  const size_t bytes = Channel::region_bytes(2, kSlot);
  std::unique_ptr<uint8_t, decltype(&std::free)> region(
      static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)), &std::free);
  std::memset(region.get(), 0, bytes);
  Hold hold;
  g_hold = &hold;
  std::string zero_failed;
  std::thread zero([&] {
    Channel channel(region.get(), 0, 2, kSlot, milliseconds(20000));
    try {
      channel.barrier();
    } catch (const std::exception& e) {
      zero_failed = e.what();
    }
  });
  {
    std::unique_lock<std::mutex> lock(hold.mutex);
    ASSERT_TRUE(hold.changed.wait_for(lock, std::chrono::seconds(10),
                                      [&] { return hold.rank_zero_held; }));
  }
  std::thread one([&] {
    Channel channel(region.get(), 1, 2, kSlot, milliseconds(20000));
    channel.barrier();  // rank 0 has arrived: this passes at once
    channel.abort();    // what the group's destructor does first
    std::lock_guard<std::mutex> lock(hold.mutex);
    hold.rank_one_left = true;
    hold.changed.notify_all();
  });
  one.join();
  zero.join();
  g_hold = nullptr;
  EXPECT_EQ(zero_failed, "") << "rank 0's barrier failed though both ranks arrived";
}

}  // namespace
