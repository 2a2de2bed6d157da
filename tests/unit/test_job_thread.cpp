// The thread a group runs its collectives on (src/comm/job_thread.h): jobs in the order posted,
// what one throws in its future, and what a job captured released by the time its future is
// ready (a collective's tensors, whose memory the caller takes again next).
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "job_thread.h"

namespace {

using ddp::comm::JobThread;

TEST(JobThread, RunsJobsInTheOrderPostedAndGivesWhatOneThrew) {
  JobThread thread;
  std::vector<int> ran;
  std::vector<std::shared_future<void>> done;
  for (int i = 0; i < 100; ++i) done.push_back(thread.post([&ran, i] { ran.push_back(i); }));
  auto failed = thread.post([] { throw std::runtime_error("job 100"); });
  for (auto& d : done) d.get();
  try {
    failed.get();
    ADD_FAILURE() << "the throwing job's future held no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "job 100");
  }
  ASSERT_EQ(ran.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(ran[static_cast<size_t>(i)], i);
}

// Many times over, since the job's end races with the caller's next step: once the future is
// ready, the job's captures are gone, a throwing job's too.
TEST(JobThread, WhatAJobCapturedIsReleasedWhenItsFutureIsReady) {
  JobThread thread;
  for (int i = 0; i < 20000; ++i) {
    auto held = std::make_shared<int>(i);
    std::weak_ptr<int> watch = held;
    const bool throws = i % 2 == 1;
    auto done = thread.post([held = std::move(held), throws] {
      if (throws) throw std::runtime_error("thrown");
    });
    done.wait();
    ASSERT_TRUE(watch.expired()) << "job " << i << "'s capture outlived its future's readiness";
  }
}

}  // namespace
