// The thread a group runs its collectives on (src/comm/job_thread.h): jobs in the order posted,
// what one throws in its future, what a job captured released by the time its future is ready
// (a collective's tensors, whose memory the caller takes again next), and a waiter that runs its
// job itself where it is next, never out of order nor beside another; the shm group's thread at
// SCHED_BATCH.
#include <gtest/gtest.h>

#include <sched.h>
#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
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

// Jobs that each check that none runs beside them and that they come in order, posted by one
// thread and waited for by another (run_if_next, then the future), as ShmWork does: each runs
// once, in order, alone, on the group's thread or on the waiter's. The waiter asks at once, so
// that it is almost always first: the group's thread takes microseconds to wake.
TEST(JobThread, AWaiterRunsItsJobItselfWhereItIsNextAndNeverOutOfOrder) {
  JobThread thread;
  std::atomic<int> running{0};
  std::vector<int> ran;
  std::vector<std::thread::id> by;
  constexpr int kJobs = 2000;
  std::vector<JobThread::Ticket> tickets;
  for (int i = 0; i < kJobs; ++i) {
    tickets.push_back(thread.post_ticket([&, i] {
      EXPECT_EQ(running.fetch_add(1), 0) << "job " << i << " ran beside another";
      ran.push_back(i);
      by.push_back(std::this_thread::get_id());
      running.fetch_sub(1);
    }));
    if (i % 3 == 0) continue;  // some left for the thread, or for a later waiter
    const bool ran_here = thread.run_if_next(tickets.back().number);
    tickets.back().done.get();
    if (ran_here) {
      EXPECT_EQ(by.back(), std::this_thread::get_id());
    }
  }
  for (auto& t : tickets) {
    EXPECT_FALSE(thread.run_if_next(t.number)) << "job " << t.number << " ran twice";
    t.done.get();
  }
  ASSERT_EQ(ran.size(), static_cast<size_t>(kJobs));
  for (int i = 0; i < kJobs; ++i) EXPECT_EQ(ran[static_cast<size_t>(i)], i);
  const auto here = std::count(by.begin(), by.end(), std::this_thread::get_id());
  EXPECT_GT(here, 0) << "no job ran on its waiter";
  EXPECT_LT(here, kJobs) << "no job ran on the group's thread";
}

TEST(JobThread, AJobRunByItsWaiterGivesWhatItThrew) {
  JobThread thread;
  for (int i = 0; i < 100; ++i) {
    auto ticket = thread.post_ticket([] { throw std::runtime_error("thrown"); });
    thread.run_if_next(ticket.number);
    EXPECT_THROW(ticket.done.get(), std::runtime_error);
  }
}

}  // namespace

// The shm group's thread does not preempt the computation when a job wakes it (Note [A woken
// collective does not preempt]): SCHED_BATCH, not SCHED_IDLE, with which a killed rank outlived
// its SIGKILL on a busy host. A job that nobody runs in its waiter's place runs on the thread,
// and sees the thread's policy; a default thread's is its caller's.
TEST(JobThread, AThreadThatWaitsItsTurnRunsItsJobsAtSchedBatchAndADefaultOneAsItsCaller) {
  const auto policy_of_a_job = [](JobThread& thread) {
    int policy = -1;
    thread.post([&policy] { policy = sched_getscheduler(0); }).get();
    return policy;
  };
  JobThread batch(JobThread::Wakeup::kWaitsItsTurn);
  EXPECT_EQ(policy_of_a_job(batch), SCHED_BATCH);
  JobThread preempts;
  EXPECT_EQ(policy_of_a_job(preempts), sched_getscheduler(0));
}
