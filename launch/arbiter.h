#pragma once
// The arbiter of elastic membership (Note [Elastic membership] and Note [Elastic nodes] in
// ddp/comm/elastic/elastic_keys.h): node 0's launcher decides, from what it is told, which workers
// form each generation, who is restarted, and when the job goes back to its newest checkpoint or
// ends.
//
// A state machine: (state, event, time) -> (state, actions), with no store, no process and no
// clock of its own (the caller tells the time with each event), so every decision is unit-tested
// (tests/unit/test_arbiter.cpp). Events (event::Lost, event::Tick...) and actions
// (action::Publish, action::RestartWorker...) are one type each, in the variants ArbiterEvent and
// ArbiterAction; workers are WorkerIds (worker_id.h). ArbiterService (arbiter_service.h) reads
// the store and the clock into events and writes the actions that concern the store; the
// supervisor carries out those that concern processes (a restart, the job's end).
//
//   Arbiter arbiter(settings, now);  // now: the caller's clock, read again for each event
//   arbiter.on(event::NodeIn{0, {WorkerId{0, 0, 0}, WorkerId{0, 1, 0}}}, now);  // "0.0", "1.0"
//   for (const ArbiterAction& a : arbiter.on(event::Tick{}, now)) ...  // action::Publish 0, ...
//
// Note [Committed state has an owner]
// The training state the group committed lives in the workers that hold it: the first
// generation of a round (they start alike, or from the same checkpoint), and every joiner whose
// heal passed its digest check (it says so: elastic/holds/<id>). A generation is published only
// while at least one of its members holds that state, and a worker's heal takes it from the one
// that holds the newest (Trainer's heal). When the last holder is lost (and no member that was
// taking the state says it holds it: Note [A joiner's word on the state]), nothing of the group's
// progress is left in any process: the job goes back to the newest checkpoint the group wrote
// (every worker started again, as torchrun restarts a group; "round" r + 1), or, without one,
// ends non-zero naming what was lost. It never lets fresh workers pass for the group.
//
// A program that does not speak the protocol (no worker wrote elastic/speaks/<id>: any program
// that is not ddp_train --elastic) is treated as torchrun's elastic agent treats every program:
// any failure restarts the whole group.
//
// Note [A joiner's word on the state]
// A joiner holds the state once its heal's digest check passed, and says so
// (elastic/holds/<id>) right after. When the last member known to hold it is lost, members that
// were taking it may hold it already, unannounced (the holder died between the check and the
// announcement). So the decision waits for their word: one says it holds the state (the
// survivors' generation is published: it goes on from there), or the members ask for the next
// generation without having said so (a member that holds it says so before any later failure:
// back to the checkpoint), or --node-timeout passes (the same). It went back to the checkpoint at
// once, though the joiner held the state.
//
// Note [Every ending is decided]
// A worker that ended with exit 0, or said it left its training loop (elastic/trained/<id>:
// ddp_train --elastic writes it after the last collective of its training), is out of the
// membership: never a member of a new generation, no longer a holder of the state. The job ends
// 0 only when no member is still training and every worker of the last generation ended 0 (so
// each did all that follows its loop: rank 0's outputs, a wrapper's last step). A worker that fails
// after it left its loop cannot be taken in by any generation, since the others are past their
// loops too: the job cannot go on, and ends at once with that failure's exit code, naming the
// worker and how it ended, restarts left or not. (A group restart from the newest checkpoint,
// as torchrun would make, trains nothing: ddp_train writes one after its last epoch. It would only
// run each worker's ending again, and a failure there is most often the same failure again.)
// Why a word from the worker, and not only its exit: ddp_train's members leave their loop
// together (its last collective is the last checkpoint's barrier), but a worker can fail after it
// before any other has ended; taken for a loss in training, the arbiter published the survivors
// (who never come: they are past their loops) and ended 0 when they exited, though the failed
// worker's outputs may be missing. And a worker that ended 0 stayed a member: the next loss
// published a generation of ended workers, and node 0 waited for it forever.
//
// Note [Losses close together are one decision]
// Workers killed together (one `kill` of several pids, an OOM kill, a node's crash) are reaped
// one by one, over some tens of milliseconds. Each loss still gives its generation up and
// publishes the survivors' at once (they wait for it; a member that dies meanwhile fails it as it
// forms), but the restarts the losses call for are decided together, once `loss_window` has
// passed since the first of them: when by then no member holding the state is left, the one
// decision is a group restart from the checkpoint (one restart), not a restart per worker and then
// a group restart with none left. The window is 500 ms: the first and last reaps of 3 ddp_train
// workers SIGKILLed by one `kill` were 6-36 ms apart on an idle 2-core machine, 40-55 ms with
// both cores busy; ten times that still costs little, as a restarted worker needs about 1 s to
// start and joins at a later step anyway: the wait delays the group's return to its full size,
// not the survivors' next step.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "worker_id.h"

namespace ddp::launch {

using Clock = std::chrono::steady_clock;

// Whether the first generation forms now: every node is in, or MIN are and the last call (the
// time since the round began, `waited`, past `last_call`) is over. A pure function.
bool first_generation_due(int nodes_in, int min_nodes, int max_nodes, Clock::duration waited,
                          Clock::duration last_call);

// What the arbiter is told, one type each: ArbiterEvent.
namespace event {
// Time passed: the first generation's last call, a request's delay, the beats.
struct Tick {};
// Node `node`'s workers are in the job (node 0's: started; another node's: registered, after its
// start or a group restart).
struct NodeIn {
  int node = 0;
  std::vector<WorkerId> workers;
};
// Another node restarted lost workers, to join.
struct Restarted {
  std::vector<WorkerId> workers;
};
// Workers ended with an error: `what` says who and how, `exit_code` is the first's.
struct Lost {
  std::vector<WorkerId> workers;
  std::string what;
  int exit_code = 1;
};
// Workers ended with exit code 0.
struct Done {
  std::vector<WorkerId> workers;
};
// The worker left its training loop (Note [Every ending is decided]).
struct Trained {
  WorkerId worker;
};
// The joiner has started and waits to be taken in.
struct Ready {
  WorkerId worker;
};
// The worker holds the committed state (its heal passed the digest check).
struct Holds {
  WorkerId worker;
};
// A worker speaks the protocol (ddp_train --elastic).
struct Speaks {};
// The group wrote a checkpoint: `which` names it.
struct Checkpoint {
  std::string which;
};
// A member asked for the generation after the current one.
// (`askers`: how many of them had asked when the request was read.)
struct Reform {
  int askers = 0;
};
// Node `node`'s beat counter reads `count`.
struct Beat {
  int node = 0;
  int64_t count = 0;
};
}  // namespace event

using ArbiterEvent = std::variant<event::Tick, event::NodeIn, event::Restarted, event::Lost,
                                  event::Done, event::Trained, event::Ready, event::Holds,
                                  event::Speaks, event::Checkpoint, event::Reform, event::Beat>;

// What the arbiter decides, one type each: ArbiterAction. The service writes those that concern
// the store; the supervisor carries out RestartWorker, RestartGroup and End.
namespace action {
// Generation `generation` is `members`, in rank order.
struct Publish {
  int64_t generation = 0;
  std::vector<WorkerId> members;
};
// Generation `generation` lost a member: `text` names it.
struct AbortNotice {
  int64_t generation = 0;
  std::string text;
};
// The joiner is ready: `generation` takes it in after its next step.
struct Grow {
  int64_t generation = 0;
  WorkerId joiner;
};
// Node `node` is in: its workers join a running group (`join`) or form the first generation of
// round `round`.
struct Admit {
  int node = 0;
  int round = 0;
  bool join = false;
};
// Node 0: start `worker`, the next incarnation of a lost worker, to join.
struct RestartWorker {
  WorkerId worker;
};
// Every node: stop every worker, start them all again, fresh, as round `round` (they resume from
// the newest checkpoint); `why` says why.
struct RestartGroup {
  int round = 0;
  std::string why;
};
// The job ends with `exit_code` (0: every member finished; `finished`, the last generation's
// workers); `why` says why.
struct End {
  int exit_code = 0;
  std::string why;
  std::vector<WorkerId> finished;
};
// `text`, for the launcher's log.
struct Note {
  std::string text;
};
}  // namespace action

using ArbiterAction =
    std::variant<action::Publish, action::AbortNotice, action::Grow, action::Admit,
                 action::RestartWorker, action::RestartGroup, action::End, action::Note>;

// The lambdas of one std::visit, one for each alternative.
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

class Arbiter {
 public:
  struct Settings {
    int min_nodes = 1;
    int max_nodes = 1;
    // A node not heard from for this long is out; also the first generation's last call.
    Clock::duration node_timeout = std::chrono::seconds(15);
    int max_restarts = 0;  // node 0's: workers restarted alone, and group restarts
    // A member's request for the next generation is granted this long after it is seen, so that
    // a member whose death made the others ask is reaped first and left out (its sockets close as
    // it dies, a moment before it can be reaped).
    Clock::duration reform_delay = std::chrono::milliseconds(100);
    // A round (the first, or one after a group restart) whose MIN nodes have not registered
    // their workers within this long ends the job.
    Clock::duration form_within = std::chrono::minutes(5);
    // Losses within this long of the first are one decision on restarts (Note [Losses close
    // together are one decision]).
    Clock::duration loss_window = std::chrono::milliseconds(500);
  };
  Arbiter(Settings settings, Clock::time_point now);

  // What `event`, told at `now` (the caller's clock), decides.
  std::vector<ArbiterAction> on(const ArbiterEvent& event, Clock::time_point now);

  enum class Phase { kForming, kRunning, kEnded };
  Phase phase() const { return phase_; }
  int round() const { return round_; }
  int64_t generation() const { return generation_; }
  // The members still training (the last generation published, less the workers lost or out of
  // their training loop since).
  const std::vector<WorkerId>& members() const { return members_; }
  // Started, not yet members: the ids whose readiness the service looks for.
  const std::vector<WorkerId>& joining() const { return joining_; }
  // Members and joiners not known to hold the committed state: whose elastic/holds/<id> the
  // service looks for before it reports a loss.
  std::vector<WorkerId> not_known_holders() const;
  bool speaks() const { return speaks_; }
  std::vector<int> other_nodes() const;  // every node but 0 ever in the job
  bool node_in(int node) const;          // in the job now (heard from within the node timeout)
  int restarts() const { return restarts_; }
  // "generation 2 of 3 worker(s): 0.0,1.1,2.0"
  std::string describe_generation() const;

 private:
  using Actions = std::vector<ArbiterAction>;
  using Ids = std::vector<WorkerId>;
  struct Node {
    bool in = true;
    int64_t beat = -1;
    Clock::time_point heard;
  };
  // One for each event.
  void handle(const event::Tick& e, Clock::time_point now, Actions& out);
  void handle(const event::NodeIn& e, Clock::time_point now, Actions& out);
  void handle(const event::Restarted& e, Clock::time_point now, Actions& out);
  void handle(const event::Lost& e, Clock::time_point now, Actions& out);
  void handle(const event::Done& e, Clock::time_point now, Actions& out);
  void handle(const event::Trained& e, Clock::time_point now, Actions& out);
  void handle(const event::Ready& e, Clock::time_point now, Actions& out);
  void handle(const event::Holds& e, Clock::time_point now, Actions& out);
  void handle(const event::Speaks& e, Clock::time_point now, Actions& out);
  void handle(const event::Checkpoint& e, Clock::time_point now, Actions& out);
  void handle(const event::Reform& e, Clock::time_point now, Actions& out);
  void handle(const event::Beat& e, Clock::time_point now, Actions& out);
  void form(Clock::time_point now, Actions& out);
  void drop_silent_nodes(Clock::time_point now, Actions& out);
  void lose(const Ids& ids, const std::string& what, int exit_code, Clock::time_point now,
            Actions& out);
  void lose_members(const Ids& ids, const std::string& notice_text, const std::string& what,
                    int exit_code, Clock::time_point now, Actions& out);
  void back_to_checkpoint(const std::string& lost, int exit_code, Clock::time_point now,
                          Actions& out);
  void settle_unowned(Clock::time_point now, Actions& out);
  void restart_later(const Ids& ids, Clock::time_point now);
  void restart_when_due(Clock::time_point now, Actions& out);
  void leave_training(const WorkerId& id);
  void end_if_finished(Actions& out);
  void restart_group(const std::string& why, int exit_code, Clock::time_point now, Actions& out);
  void end(int exit_code, const std::string& why, Actions& out);
  void publish(Actions& out);
  void take_in_ready_joiners();
  bool holds_state(const WorkerId& id) const { return holders_.count(id) != 0; }
  bool reform_due(Clock::time_point now) const;
  bool any_holder() const;
  int nodes_in() const;
  std::string below_min() const;
  bool finished() const;
  int rank_of(const WorkerId& id) const;  // in the last generation published; -1

  Settings settings_;
  Phase phase_ = Phase::kForming;
  int round_ = 0;
  Clock::time_point round_began_;
  std::set<int> registered_;  // kForming: nodes whose workers are in this round
  Ids members_;               // kForming: the first generation so far
  Ids published_;             // the last generation published
  Ids joining_;               // started to join, not yet members
  Ids ready_;                 // of those, the ones that are ready
  // This round's workers out of their training loop, and those of them that ended with exit 0
  // (Note [Every ending is decided]).
  std::set<WorkerId> out_of_training_;
  std::set<WorkerId> ended_ok_;
  std::set<WorkerId> holders_;
  // Lost workers to restart once the loss window closes (Note [Losses close together are one
  // decision]), since the first loss.
  Ids to_restart_;
  Clock::time_point first_loss_;
  // The last known holder lost while members were still taking the state: what was lost, the
  // loss's exit code, and since when their word is awaited (Note [A joiner's word on the state]).
  struct Unowned {
    std::string lost;
    int exit_code = 1;
    Clock::time_point since;
  };
  std::optional<Unowned> unowned_;
  bool speaks_ = false;
  std::string checkpoint_;     // the newest the group wrote ("" : none)
  std::map<int, Node> nodes_;  // the other nodes, by node rank
  int64_t generation_ = -1;    // the last published
  std::optional<Clock::time_point> reform_seen_;
  int reform_askers_ = 0;  // of the request seen
  int restarts_ = 0;
};

}  // namespace ddp::launch
