#pragma once
// This worker's place in its process group: the group's watchdog, and under --elastic the worker
// side of elastic training (the protocol is Note [Elastic membership] in
// ddp/comm/elastic/elastic_keys.h, the launcher's side launch/arbiter.h): where this member stands,
// its vote on every step, the change of generation, the heal that gives every member one consistent
// state (a TrainState, sent whole by one member), the group growing, and the records of it all. The
// member replaces the group (Distributed::group) and moves the state; the Trainer calls it at named
// points and never sees the agent, a vote or a generation:
//
//   while (epoch < epochs) {
//     const bool kept = elastic.attempt([&] {       // an epoch, and what follows it
//       ...
//       elastic.commit([&] { reduce the step's gradients; gather its sample ids; });
//       optimizer step; count the step;
//       elastic.reached(position, samples_line);    // may re-form the group: a worker joins
//       ...
//     });
//     epoch = kept ? epoch + 1 : state's epoch;     // re-formed: where the healed state is
//   }
//   elastic.done_training();                        // no generation after this one
//
// Without --elastic it does nothing: attempt() and commit() run their function, the rest returns.
//
// Note [One state transfer per change]
// After a change of membership the new generation takes exactly one state, from one member: the
// one holding the newest committed state (Note [Committed state has an owner] in
// launch/arbiter.h: the member with the highest step among those that hold it; the lowest rank of
// those on a tie). Members may differ by one step (Note [A step's vote travels during the next
// step]); every state a member holds is consistent (a step is applied whole or not at all, a
// state is taken whole or not at all), so whichever transfer fails, the next attempt starts again
// from one consistent state. DDP's own broadcast of rank 0's weights is not done on a change
// (init_sync off): two transfers could mix one member's parameters with another's optimizer
// state. Every member then proves it holds the source's state (a digest, all-gathered) before
// the generation's first step, and says so to the launcher (elastic/holds/<id>).

#include <torch/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/diagnostics/watchdog.h"
#include "ddp/train/distributed.h"
#include "ddp/train/metrics.h"
#include "ddp/train/timeline.h"
#include "ddp/train/train_state.h"

namespace ddp::train {

class ElasticMember {
 public:
  struct Options {
    std::string output_dir;       // samples.jsonl's
    bool record_samples = false;  // --record-samples
    std::string log_level;        // log::init's, for a member that becomes rank 0
    double stall_warning = 60.0;  // --stall-warning: the watchdog's, in seconds
  };
  // Starts the watchdog of `dist`'s group. `dist` and `state` outlive the member; `timeline` may
  // be null.
  ElasticMember(Distributed& dist, TrainState& state, Timeline* timeline, Options options);

  bool enabled() const { return dist_.agent != nullptr; }

  // Runs `part` (the training's construction, an epoch): true when it ran to its end in this
  // generation; false when the group changed meanwhile (a member lost or failed, a worker
  // joined) and this member now holds the new generation's state, to go on from.
  bool attempt(const std::function<void()>& part);
  // A worker that joins a running group (Distributed::joining): takes the group's state, once
  // the state is built (later calls, and other workers, do nothing).
  void join();
  // The collectives of a step (its gradients' reduction, its sample ids): `reduce`. When one
  // fails, the step is dropped on every member (nobody applies it), and this member leaves its
  // generation; else the step may be applied (Note [A step's vote travels during the next step]).
  void commit(const std::function<void()>& reduce);
  // The training reached `at` (an epoch's start, a counted step, the epoch's end): where a
  // failure from here on goes on from. `samples_line` (a counted step's, with --record-samples):
  // its line of samples.jsonl, which the heal hands to a new rank 0. Leaves the generation after
  // a decision to grow, unless the epoch has no step left.
  void reached(EpochPosition at, std::string samples_line = "");
  // Before collectives that are not a step's (the epoch's end, a stop): the last step's decision.
  void settle();
  // Rank 0 wrote a checkpoint (`which`): the launcher can go back to it if the group's state is
  // lost (Note [Committed state has an owner]).
  void checkpoint_saved(const std::string& which);
  // The training loop is over here, its last collective done: the launcher takes this member into
  // no later generation, and a failure from here on is one of the job's ending (Note [Every ending
  // is decided] in launch/arbiter.h).
  void done_training();
  // The changes not yet in metrics.jsonl.
  std::vector<MembershipRecord> take_records();
  // The watchdog's flight record of this rank's last collectives, written with `reason`: its
  // path ("" when none was written: an elastic member whose last generation never formed).
  std::string dump_flight_record(const std::string& reason);

 private:
  struct Change;  // thrown out of a step when the group must re-form; attempt() catches it
  [[noreturn]] void leave(std::string why, bool failed);
  void reform(const Change& change);
  void form_next_generation();
  void heal();
  int state_source();  // the rank the heal takes the state from (a collective)
  // Every member holds the source's state (`from`, rank `source`), bitwise (a collective).
  void check_state(int source, const std::string& from);
  void complete_samples_record();

  Distributed& dist_;
  TrainState& state_;
  Timeline* timeline_;
  Options options_;
  std::unique_ptr<comm::Watchdog> watchdog_;  // of dist_.group; stops before the group goes
  // Where this member's state stands, since its last counted step (none: state_.position()).
  std::optional<EpochPosition> position_;
  bool holds_state_ = false;  // Note [Committed state has an owner]
  int64_t vote_round_ = 0;    // steps voted on in this generation
  bool grow_due_ = false;     // a decision said "grow", not yet done
  // The last change until the first step after it is committed (then its recovery time is
  // known), and the changes not yet taken.
  std::optional<std::pair<MembershipRecord, std::chrono::steady_clock::time_point>> recovering_;
  std::vector<MembershipRecord> records_;
  // --record-samples: the lines of the last steps this member applied; a new rank 0 completes
  // samples.jsonl from the source's.
  std::deque<std::pair<int64_t, std::string>> recent_samples_;
};

}  // namespace ddp::train
