// ddp_fault_train: ddp_train with a fault injected by the test that starts it. The same command
// line and trainer as ddp_train (apps/train_main.h), on a process group wrapped in FaultyGroup,
// which acts on one rank where a phase of the training step begins. The shipped ddp_train reads
// no test variable: the faults live here only.
//
//   ddp_fault_train --fault ACTION --fault-rank R (--fault-after-step N | --fault-at PHASE)
//                   <ddp_train's options>
//
// ACTION: kill (SIGKILL, after logging "fault: SIGKILL ..."), sigterm (a SIGTERM to itself),
// perturb (adds 1e-3 to the model's first parameter), or delay:S (waits S seconds, after logging
// "fault: waiting ..."). The trigger: --fault-after-step N, the first phase after optimizer step
// N (its --checkpoint-on-signal or parameter check, the next step's forward, or the epoch's end),
// or --fault-at PHASE, where the phase labelled PHASE begins ("step 3: backward"), before any of
// its collectives. Only in the job's first run (a launcher's restart runs clean) and on rank R
// (default 0).
#include <fmt/format.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/rendezvous.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/train/distributed.h"
#include "train_main.h"

namespace {

struct Fault {
  std::string action;  // kill, sigterm, perturb, delay:S
  int rank = 0;
  int64_t after_step = 0;  // 0: --fault-at instead
  std::string at_phase;
};

// Takes the --fault* options (each followed by its value) out of argv; the rest is ddp_train's.
Fault take_fault_options(std::vector<char*>& args) {
  Fault fault;
  std::vector<char*> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string word = args[i];
    if (word.rfind("--fault", 0) != 0) {
      rest.push_back(args[i]);
      continue;
    }
    if (i + 1 == args.size()) throw ddp::InputError(word + " needs a value");
    const std::string value = args[++i];
    if (word == "--fault")
      fault.action = value;
    else if (word == "--fault-rank")
      fault.rank = std::stoi(value);
    else if (word == "--fault-after-step")
      fault.after_step = std::stoll(value);
    else if (word == "--fault-at")
      fault.at_phase = value;
    else
      throw ddp::InputError("unknown option " + word);
  }
  const auto& a = fault.action;
  if (a != "kill" && a != "sigterm" && a != "perturb" && a.rfind("delay:", 0) != 0) {
    throw ddp::InputError("--fault: expected kill, sigterm, perturb or delay:S, got '" + a + "'");
  }
  args = rest;
  return fault;
}

// The process group of the trainer: every collective goes to `inner`, numbered as there; the
// fault acts in set_phase, where the trainer and the reducer name what comes next.
class FaultyGroup : public ddp::comm::ProcessGroup {
 public:
  FaultyGroup(std::shared_ptr<ProcessGroup> inner, Fault fault)
      : ProcessGroup(inner->rank(), inner->world_size(), inner->options()),
        inner_(std::move(inner)),
        fault_(std::move(fault)) {
    wrap(*inner_);
  }
  std::string backend_name() const override { return inner_->backend_name(); }
  void set_module(torch::nn::Module* module) { module_ = module; }

  void set_phase(std::string phase) override {
    ProcessGroup::set_phase(phase);
    if (!done_ && triggered(phase)) {
      done_ = true;
      act(phase);
    }
  }

 protected:
  using WorkPtr = ddp::comm::WorkPtr;
  using Info = ddp::comm::CollectiveInfo;
  using Op = ddp::comm::ReduceOp;
  WorkPtr do_all_reduce(at::Tensor& t, Op op, const Info&) override {
    return inner_->all_reduce(t, op);
  }
  WorkPtr do_broadcast(at::Tensor& t, int root, const Info&) override {
    return inner_->broadcast(t, root);
  }
  WorkPtr do_all_gather(at::Tensor& out, const at::Tensor& in, const Info&) override {
    return inner_->all_gather(out, in);
  }
  WorkPtr do_reduce_scatter(at::Tensor& out, const at::Tensor& in, Op op, const Info&) override {
    return inner_->reduce_scatter(out, in, op);
  }
  WorkPtr do_all_to_all(at::Tensor& out, const at::Tensor& in, const Info&) override {
    return inner_->all_to_all(out, in);
  }
  WorkPtr do_barrier(const Info&) override { return inner_->barrier(); }
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks, const Info&) override {
    return inner_->new_group(ranks);
  }

 private:
  // --fault-after-step N: a phase of step N was seen, and this one is neither its forward or
  // backward (micro-batches repeat them) nor the reducer's "backward: ..." within them.
  bool triggered(const std::string& phase) {
    if (fault_.after_step == 0) return phase == fault_.at_phase;
    const std::string own = fmt::format("step {}: ", fault_.after_step);
    const bool of_step = phase.rfind(own, 0) == 0;
    const bool in_pass =
        phase == own + "forward" || phase == own + "backward" || phase.rfind("backward: ", 0) == 0;
    if (of_step) seen_step_ = true;
    return seen_step_ && !in_pass;
  }

  void act(const std::string& phase) {
    const std::string where = fault_.after_step != 0
                                  ? fmt::format("after step {}", fault_.after_step)
                                  : fmt::format("on entering '{}'", phase);
    if (fault_.action == "kill") {
      ddp::log::warn("rank {}: fault: SIGKILL {}", rank(), where);
      spdlog::default_logger()->flush();
      ::kill(::getpid(), SIGKILL);
    } else if (fault_.action == "sigterm") {
      ::kill(::getpid(), SIGTERM);
    } else if (fault_.action == "perturb") {
      torch::NoGradGuard no_grad;
      module_->parameters().front().add_(1e-3);
    } else if (fault_.action.rfind("delay:", 0) == 0) {
      const double seconds = std::atof(fault_.action.c_str() + 6);
      ddp::log::warn("rank {}: fault: waiting {} s {}", rank(), seconds, where);
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    }
  }

  std::shared_ptr<ProcessGroup> inner_;
  Fault fault_;
  torch::nn::Module* module_ = nullptr;
  bool seen_step_ = false;
  bool done_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  Fault fault;
  try {
    fault = take_fault_options(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_fault_train: %s\n", e.what());
    return 2;
  }
  return ddp::apps::train_main(
      static_cast<int>(args.size()), args.data(), [&fault](const ddp::train::Config& config) {
        auto dist = ddp::train::init_distributed(config, ddp::comm::current_env());
        std::shared_ptr<FaultyGroup> faulty;
        if (dist.launch.restart_count == 0 && dist.rank() == fault.rank) {
          faulty = std::make_shared<FaultyGroup>(dist.group, fault);
          dist.group = faulty;
        }
        ddp::train::Trainer trainer(config, dist);
        if (faulty) faulty->set_module(&trainer.module());
        return trainer.run();
      });
}
