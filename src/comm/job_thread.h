#pragma once
// A thread that runs jobs one at a time in the order they were posted: what a group needs to run
// its collectives away from the caller while keeping their order (every rank issues a group's
// collectives in the same order). A waiter may run the next job itself (run_if_next), never
// beside another. The hierarchical group's steps and the mpi backend's blocking calls run on one
// each; the shm backend's collectives too, or on their waiters.

#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <sched.h>

namespace ddp::comm {

class JobThread {
 public:
  // What the thread does when a job wakes it. kPreempts: as any thread (SCHED_OTHER), it may
  // preempt the thread running on its core. kWaitsItsTurn (SCHED_BATCH): it takes a free core at
  // once, and on a busy one waits for its turn (the next tick, or the running thread blocking),
  // with the same share of the core from then on. Note [A woken collective does not preempt].
  enum class Wakeup { kPreempts, kWaitsItsTurn };

  explicit JobThread(Wakeup wakeup = Wakeup::kPreempts)
      : wakeup_(wakeup), thread_([this] { run(); }) {}
  ~JobThread() { stop(std::chrono::milliseconds::max()); }
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  // A job posted: its future and its number in the order (run_if_next).
  struct Ticket {
    std::shared_future<void> done;
    uint64_t number = 0;
  };

  // The job's future: ready once it ran, holding what it threw, and once the job itself is gone
  // with what it captured. A collective's tensors are released when its wait() returns: memory
  // they held (a slot of FSDP's pool) is free again for whatever the caller does next.
  Ticket post_ticket(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mutex_);
    Job entry{std::move(job), {}, next_number_++};
    Ticket ticket{entry.done.get_future().share(), entry.number};
    jobs_.push_back(std::move(entry));
    wake_.notify_all();
    return ticket;
  }
  std::shared_future<void> post(std::function<void()> job) {
    return post_ticket(std::move(job)).done;
  }

  // Where job `number` is the next to run and none is running, runs it here, on the caller's
  // thread, and says so: what the thread would do next anyway, without the hand-over (the thread
  // woken, the caller asleep until the thread wakes it back), which costs tens to hundreds of
  // microseconds where every core is busy. The order holds: one job at a time, in order. False
  // where the job is running, done, or behind another.
  bool run_if_next(uint64_t number) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (running_ || jobs_.empty() || jobs_.front().number != number) return false;
    run_front(lock);
    // The thread, only for jobs posted behind it (or a stop asked meanwhile): waking it for
    // nothing costs a system call and two context switches, a few microseconds each where every
    // core is busy, on each step's bucket.
    if (!jobs_.empty() || stop_) wake_.notify_all();
    return true;
  }

  // Runs what was posted, then ends the thread; false when that took longer than `patience`
  // (a job stuck in a collective the other ranks never join): the thread is then left running.
  // Once; the destructor calls it without a limit otherwise.
  bool stop(std::chrono::milliseconds patience) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!thread_.joinable()) return ended_;
    stop_ = true;
    wake_.notify_all();
    const bool ended = patience == std::chrono::milliseconds::max()
                           ? (wake_.wait(lock, [&] { return ended_; }), true)
                           : wake_.wait_for(lock, patience, [&] { return ended_; });
    lock.unlock();
    if (ended) {
      thread_.join();
    } else {
      thread_.detach();
    }
    return ended;
  }

 private:
  struct Job {
    std::function<void()> run;
    std::promise<void> done;
    uint64_t number;
  };

  // Not while a caller runs one (run_if_next): the thread ends only after it.
  void run() {
    if (wakeup_ == Wakeup::kWaitsItsTurn) {
      sched_param none{};  // SCHED_BATCH has no priorities; a refusal leaves it as it was
      pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);
    }
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return !running_ && (stop_ || !jobs_.empty()); });
      if (jobs_.empty()) break;  // stopping, nothing left
      run_front(lock);
    }
    ended_ = true;
    wake_.notify_all();
  }

  // The first job, run with `lock` (held) released meanwhile, and no other beside it.
  void run_front(std::unique_lock<std::mutex>& lock) {
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    running_ = true;
    lock.unlock();
    execute(job);
    lock.lock();
    running_ = false;
  }

  static void execute(Job& job) {
    std::exception_ptr error;
    try {
      job.run();
    } catch (...) {
      error = std::current_exception();  // to the job's future
    }
    job.run = nullptr;
    if (error) {
      job.done.set_exception(error);
    } else {
      job.done.set_value();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;  // a job posted or stop asked (run); the thread ended (stop)
  std::deque<Job> jobs_;
  uint64_t next_number_ = 0;
  bool running_ = false;  // a job is running, on the thread or on a caller's
  bool stop_ = false;
  bool ended_ = false;
  const Wakeup wakeup_;
  std::thread thread_;  // last: started once the rest is set
};

}  // namespace ddp::comm
