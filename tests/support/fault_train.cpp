// ddp_fault_train: ddp_train with faults injected by the test that starts it. The same command
// line and trainer as ddp_train (apps/train_main.h), on a process group wrapped in FaultyGroup,
// which acts on one rank where a phase of the training step begins. The shipped ddp_train reads
// no test variable: the faults live here only.
//
//   ddp_fault_train [--fault ACTION --fault-rank R (--fault-after-step N | --fault-at PHASE)]...
//                   <ddp_train's options>
//
// ACTION: kill (SIGKILL, after logging "fault: SIGKILL ..."), sigterm (a SIGTERM to itself),
// perturb (adds 1e-3 to the model's first parameter), delay:S (waits S seconds, after logging
// "fault: waiting ..."), extra (an all_reduce of 3 floats the other ranks do not issue: a
// collective in a branch of user code that one rank alone takes), or fail (the phase's first
// collective completes, then this rank alone sees it fail: its wait throws CommError, as if the
// last packet had been lost on its side only; the process lives on), kill-after (the phase's
// first collective completes, then SIGKILL: a member lost right after it, on every member's side
// of it) or delay-after:S (the phase's first collective completes, then this rank waits S seconds
// before it returns: a member late in what follows it). Under --elastic, the phase
// "elastic: vote" is each vote's (on its own thread): fail there counts the vote and then fails
// it on this rank. The trigger: --fault-after-step N, the first phase after optimizer step N (its
// --checkpoint-on-signal or parameter check, the next step's fetching of its batches, or the
// epoch's end), or --fault-at PHASE, where the phase labelled PHASE (a shell pattern) begins
// ("step 3: backward"), before any of its collectives; both: the first PHASE after step N
// ("backward: bucket 0"). Only in the job's first run (a launcher's restart runs clean) and on
// rank R (default 0), or, with --fault-worker ID, on the elastic worker ID in any run ("1.1": the
// first restart of local rank 1). Each --fault starts another fault: several ranks can fail at
// once, or one after another.
//
// --fault-pace S: every rank of the first run waits S seconds where each step's forward begins
// while its group is smaller than the job at full size (the launcher's WORLD_SIZE: --nnodes MAX x
// --nproc), so that a restarted worker, or a node that comes late, has the time to start before a
// small group ends the job.
//
// --slow-rank R with --slow-compute S and/or --slow-data S: rank R of the first run waits S
// seconds where each step's forward begins (its computation is slower) or where each step's
// batches are fetched (its data loader is slower): a straggler, for straggler.h's tests.
//
// Under --elastic each generation's group is wrapped too (FaultyAgent), and R is the worker's
// rank in the first generation. There, two more phases begin: "elastic: forming generation G"
// (before the worker connects to generation G's group), and the heal's on the new group:
// "elastic: generation G: state holders" (who holds the committed state, at which step),
// "elastic: generation G: state" (its transfer from the newest holder), "elastic: generation G:
// state check" (the digests).
#include <fmt/format.h>
#include <fnmatch.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/elastic/elastic.h"
#include "ddp/comm/launch_info.h"
#include "ddp/comm/process_group.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/train/distributed.h"
#include "forwarding_group.h"
#include "train_main.h"
#include "user_code.h"

namespace {

struct Slowness {
  int rank = -1;  // -1: none
  double compute_s = 0, data_s = 0;
};

struct Fault {
  std::string action;  // kill, sigterm, perturb, delay:S, extra, fail, kill-after, delay-after:S
  int rank = 0;
  std::string worker;      // --fault-worker: an elastic worker's id, in place of the rank
  int64_t after_step = 0;  // 0: --fault-at instead
  std::string at_phase;
};

// Whether fault `action` acts once the phase's first collective completed.
bool acts_after(const std::string& action) {
  return action == "fail" || action == "kill-after" || action.rfind("delay-after:", 0) == 0;
}

// Takes the --fault* options (each followed by its value) out of argv; the rest is ddp_train's.
std::vector<Fault> take_fault_options(std::vector<char*>& args, double& pace, Slowness& slow) {
  std::vector<Fault> faults;
  std::vector<char*> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string word = args[i];
    if (word.rfind("--fault", 0) != 0 && word.rfind("--slow-", 0) != 0) {
      rest.push_back(args[i]);
      continue;
    }
    if (i + 1 == args.size()) throw ddp::InputError(word + " needs a value");
    const std::string value = args[++i];
    if (word == "--slow-rank") {
      slow.rank = std::stoi(value);
      continue;
    }
    if (word == "--slow-compute" || word == "--slow-data") {
      (word == "--slow-compute" ? slow.compute_s : slow.data_s) = std::stod(value);
      continue;
    }
    if (word == "--fault") {
      faults.emplace_back().action = value;
      continue;
    }
    if (word == "--fault-pace") {
      pace = std::stod(value);
      continue;
    }
    if (faults.empty()) throw ddp::InputError(word + " before any --fault");
    Fault& fault = faults.back();
    if (word == "--fault-rank")
      fault.rank = std::stoi(value);
    else if (word == "--fault-after-step")
      fault.after_step = std::stoll(value);
    else if (word == "--fault-at")
      fault.at_phase = value;
    else if (word == "--fault-worker")
      fault.worker = value;
    else
      throw ddp::InputError("unknown option " + word);
  }
  for (const Fault& fault : faults) {
    const auto& a = fault.action;
    if (a != "kill" && a != "sigterm" && a != "perturb" && a != "extra" && !acts_after(a) &&
        a.rfind("delay:", 0) != 0) {
      throw ddp::InputError(
          "--fault: expected kill, sigterm, perturb, extra, fail, kill-after, delay:S or "
          "delay-after:S, got '" +
          a + "'");
    }
  }
  args = rest;
  return faults;
}

// The faults of this worker, across the generations of its group: each acts once.
class Faults {
 public:
  Faults(const std::vector<Fault>& faults, double pace, int full_world, Slowness slow = {})
      : faults_(faults.begin(), faults.end()), pace_(pace), full_world_(full_world), slow_(slow) {}
  void set_module(torch::nn::Module* module) { module_ = module; }

  // Where `phase` begins on this worker (its rank `rank` now, of `world`), whose group is `group`
  // (null before the group exists). Returns the fault that triggered here to act once the phase's
  // first collective completed (fail, kill-after, delay-after:S; "" for none): the caller's.
  std::string at_phase(const std::string& phase, int rank, int world,
                       ddp::comm::ProcessGroup* group = nullptr) {
    const std::lock_guard<std::mutex> lock(mutex_);  // the elastic vote's thread calls too
    const auto step_part = [&](const std::string& part) {
      return phase.rfind("step ", 0) == 0 && phase.size() > part.size() &&
             phase.compare(phase.size() - part.size(), part.size(), part) == 0;
    };
    const auto wait = [](double s) {
      std::this_thread::sleep_for(std::chrono::duration<double>(s));
    };
    if (pace_ > 0 && world < full_world_ && step_part(": forward")) wait(pace_);
    if (rank == slow_.rank && step_part(": forward")) wait(slow_.compute_s);
    if (rank == slow_.rank && step_part(": data")) wait(slow_.data_s);
    std::string after;
    for (State& s : faults_) {
      if (!s.done && triggered(s, phase)) {
        s.done = true;
        if (acts_after(s.fault.action)) {
          const std::string& a = s.fault.action;
          ddp::log::warn("rank {}: fault: the first collective of '{}' {} here once it completed",
                         rank, phase,
                         a == "fail"         ? "fails"
                         : a == "kill-after" ? "is followed by a SIGKILL"
                                             : "is followed by a wait (" + a + ")");
          after = s.fault.action;
        }
        act(s.fault, phase, rank, group);
      }
    }
    return after;
  }

 private:
  struct State {
    explicit State(Fault f) : fault(std::move(f)) {}
    Fault fault;
    bool seen_step = false;
    bool done = false;
  };

  // --fault-at's PHASE is a shell pattern (fnmatch): "elastic: generation *: a worker joins"
  // is the first grow whatever the generations before it.
  static bool is_at(const Fault& fault, const std::string& phase) {
    return fnmatch(fault.at_phase.c_str(), phase.c_str(), 0) == 0;
  }

  // --fault-after-step N: a phase of step N was seen, and this one is neither its data,
  // forward, backward (micro-batches repeat them) or optimizer nor the reducer's "backward: ..."
  // (with --fault-at too: this one is PHASE).
  static bool triggered(State& s, const std::string& phase) {
    if (s.fault.after_step == 0) return is_at(s.fault, phase);
    const std::string own = fmt::format("step {}: ", s.fault.after_step);
    const bool of_step = phase.rfind(own, 0) == 0;
    const bool in_pass = phase == own + "data" || phase == own + "forward" ||
                         phase == own + "backward" || phase == own + "optimizer" ||
                         phase.rfind("backward: ", 0) == 0;
    // The data phase does not count as seen: at an epoch's end the trainer labels the fetch of a
    // step that does not come ("step 9: data" after step 8, the epoch's last).
    if (of_step && phase != own + "data") s.seen_step = true;
    if (!s.fault.at_phase.empty()) return s.seen_step && !of_step && is_at(s.fault, phase);
    return s.seen_step && !in_pass;
  }

  void act(const Fault& fault, const std::string& phase, int rank, ddp::comm::ProcessGroup* group) {
    const std::string where = fault.at_phase.empty()
                                  ? fmt::format("after step {}", fault.after_step)
                                  : fmt::format("on entering '{}'", phase);
    if (fault.action == "kill") {
      ddp::log::warn("rank {}: fault: SIGKILL {}", rank, where);
      spdlog::default_logger()->flush();
      ::kill(::getpid(), SIGKILL);
    } else if (fault.action == "sigterm") {
      ::kill(::getpid(), SIGTERM);
    } else if (fault.action == "extra" && group != nullptr) {
      ddp::log::warn("rank {}: fault: an all_reduce the others do not issue, {}", rank, where);
      auto extra = at::ones({3}, at::kFloat);
      group->all_reduce(extra)->wait();
    } else if (fault.action == "perturb") {
      torch::NoGradGuard no_grad;
      module_->parameters().front().add_(1e-3);
    } else if (fault.action.rfind("delay:", 0) == 0) {
      wait_in_user_code(std::atof(fault.action.c_str() + 6), rank, where);
    }
  }

  std::mutex mutex_;
  std::vector<State> faults_;
  double pace_ = 0;
  int full_world_ = 0;
  Slowness slow_;
  torch::nn::Module* module_ = nullptr;
};

// The process group of the trainer: every collective goes to `inner`, numbered as there; the
// faults act in set_phase, where the trainer and the reducer name what comes next.
class FaultyGroup : public ddp::testing::ForwardingGroup {
 public:
  FaultyGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<Faults> faults)
      : ForwardingGroup(std::move(inner)), faults_(std::move(faults)) {}

  void set_phase(std::string phase) override {
    ProcessGroup::set_phase(phase);
    const std::string after = faults_->at_phase(phase, rank(), world_size(), this);
    if (!after.empty()) after_next_ = after;
  }

 protected:
  WorkPtr do_all_reduce(at::Tensor& t, Op op, const Info&) override {
    return maybe_failing(inner_->all_reduce(t, op));
  }
  WorkPtr do_broadcast(at::Tensor& t, int root, const Info&) override {
    return maybe_failing(inner_->broadcast(t, root));
  }
  WorkPtr do_all_gather(at::Tensor& out, const at::Tensor& in, const Info&) override {
    return maybe_failing(inner_->all_gather(out, in));
  }

 private:
  // A fault that acts after a collective: it runs to its end here (and so everywhere), then its
  // wait throws (fail), this process is killed (kill-after) or waits (delay-after:S).
  class FailingWork : public ddp::comm::Work {
   public:
    FailingWork(WorkPtr inner, std::string action)
        : inner_(std::move(inner)), action_(std::move(action)) {}
    void wait() override {
      inner_->wait();
      if (action_ == "kill-after") {
        spdlog::default_logger()->flush();
        ::kill(::getpid(), SIGKILL);
      }
      if (action_ != "fail") {  // delay-after:S
        std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(action_.c_str() + 12)));
        return;
      }
      throw ddp::comm::CommError({},
                                 "fault: the collective completed, and failed on this rank only");
    }
    bool is_completed() override { return inner_->is_completed(); }

   private:
    WorkPtr inner_;
    std::string action_;
  };
  WorkPtr maybe_failing(WorkPtr work) {
    if (after_next_.empty()) return work;
    return std::make_shared<FailingWork>(std::move(work), std::exchange(after_next_, ""));
  }

  std::shared_ptr<Faults> faults_;
  std::string after_next_;  // the fault to act after the next collective
};

// --elastic: every later generation's group is a FaultyGroup too.
class FaultyAgent : public ddp::comm::ElasticAgent {
 public:
  FaultyAgent(const ddp::comm::LaunchInfo& launch, std::string id,
              ddp::comm::ElasticAgentOptions options, std::shared_ptr<Faults> faults)
      : ElasticAgent(launch, std::move(id), std::move(options)), faults_(std::move(faults)) {}
  // The vote in flight runs this class's vote(): it ends before this part of the agent goes.
  ~FaultyAgent() override {
    try {
      abandon_vote();
    } catch (const std::exception&) {
      // the store is gone with the launcher: the vote has ended too
    }
  }

  // The phase "elastic: vote" begins where a step's vote is cast (on the trainer's thread): a
  // fault "fail" there counts the vote, then fails it on this rank.
  void vote_in_background(const ddp::comm::Membership& m, int64_t round) override {
    if (faults_->at_phase("elastic: vote", m.rank, m.world_size()) == "fail") fail_round_ = round;
    ElasticAgent::vote_in_background(m, round);
  }
  ddp::comm::StepDecision vote(const ddp::comm::Membership& m, int64_t round, bool ok) override {
    const ddp::comm::StepDecision decision = ElasticAgent::vote(m, round, ok);
    int64_t armed = round;  // rounds count from 1 in each generation: the fault acts once
    if (fail_round_.compare_exchange_strong(armed, -1)) {
      throw ddp::comm::CommError({}, "fault: the vote was counted, and failed on this rank");
    }
    return decision;
  }

  std::unique_ptr<ddp::comm::ProcessGroup> make_group(const ddp::comm::Membership& m,
                                                      const ddp::comm::ProcessGroupOptions& options,
                                                      const std::string& backend) override {
    faults_->at_phase(fmt::format("elastic: forming generation {}", m.generation), m.rank,
                      m.world_size());
    return std::make_unique<FaultyGroup>(ElasticAgent::make_group(m, options, backend), faults_);
  }

 private:
  std::shared_ptr<Faults> faults_;
  std::atomic<int64_t> fail_round_{-1};
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  std::vector<Fault> faults;
  double pace = 0;
  Slowness slow;
  try {
    faults = take_fault_options(args, pace, slow);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_fault_train: %s\n", e.what());
    return 2;
  }
  return ddp::apps::train_main(
      static_cast<int>(args.size()), args.data(),
      [&](const ddp::train::Config& config, std::optional<ddp::train::Workload> preloaded) {
        auto dist = ddp::train::init_distributed(config, ddp::comm::current_env());
        std::vector<Fault> mine;
        for (const Fault& fault : faults) {
          const bool here = fault.worker.empty()
                                ? dist.launch.restart_count == 0 && dist.group &&
                                      dist.rank() == fault.rank
                                : dist.agent && dist.agent->id() == fault.worker;
          if (here) mine.push_back(fault);
        }
        std::shared_ptr<Faults> state;
        const bool first_run = dist.launch.restart_count == 0;
        if (!mine.empty() || (first_run && (pace > 0 || slow.rank >= 0))) {
          const char* full = std::getenv("WORLD_SIZE");
          if (!first_run) slow.rank = -1;
          state = std::make_shared<Faults>(
              mine, pace, full ? std::atoi(full) : dist.launch.world_size, slow);
          // An elastic joiner has no group yet: its groups come from the FaultyAgent.
          if (dist.group) dist.group = std::make_shared<FaultyGroup>(dist.group, state);
          if (dist.agent) {
            dist.agent = std::make_shared<FaultyAgent>(dist.launch, dist.agent->id(),
                                                       dist.agent->options(), state);
          }
        }
        // Moved: under --elastic the trainer must hold the only reference to each generation's
        // group, whose connections close when it is replaced (see Trainer's constructor).
        ddp::train::Trainer trainer(config, std::move(dist), std::move(preloaded));
        if (state) state->set_module(&trainer.module());
        return trainer.run();
      });
}
