#pragma once
// The arbiter of elastic membership (Note [Elastic membership] and Note [Elastic nodes] in
// ddp/comm/elastic/elastic_keys.h): node 0's launcher decides, from what it is told, which workers
// form each generation, who is restarted, and when the job goes back to its newest checkpoint or
// ends.
//
// A state machine: (state, event) -> (state, actions), with no store, no process and no clock of
// its own (each event carries the time), so every decision is unit-tested
// (tests/unit/test_arbiter.cpp). ArbiterService (arbiter_service.h) reads the store into events
// and writes the actions that concern the store; the supervisor carries out those that concern
// processes (a restart, the job's end).
//
//   Arbiter arbiter(settings, now);
//   arbiter.on({ArbiterEvent::Kind::kNode, {"0.0", "1.0"}});  // node 0's workers, started
//   for (const ArbiterAction& a : arbiter.on(tick(now))) ...   // kPublish generation 0, ...
//
// Note [Committed state has an owner]
// The training state the group committed lives in the workers that hold it: the first
// generation of a round (they start alike, or from the same checkpoint), and every joiner whose
// heal passed its digest check (it says so: elastic/holds/<id>). A generation is published only
// while at least one of its members holds that state, and a worker's heal takes it from the one
// that holds the newest (Trainer's heal). When the last holder is lost, nothing of the group's
// progress is left in any process: the job goes back to the newest checkpoint the group wrote
// (every worker started again, as torchrun restarts a group; "round" r + 1), or, without one,
// ends non-zero naming what was lost. It never lets fresh workers pass for the group.
//
// A program that does not speak the protocol (no worker wrote elastic/speaks/<id>: any program
// that is not ddp_train --elastic) is treated as torchrun's elastic agent treats every program:
// any failure restarts the whole group.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddp::launch {

using Clock = std::chrono::steady_clock;

// A worker's id: "<local rank>.<incarnation>" on one node, "<node>.<local rank>.<incarnation>" on
// several. Pure functions.
std::string elastic_worker_id(bool several_nodes, int node, int local_rank, int incarnation);
int node_of_worker(const std::string& id);         // 0 for an id of one node
int local_rank_of_worker(const std::string& id);   // the number before the last
int incarnation_of_worker(const std::string& id);  // the last number
// The id of the worker that replaces `id` (its next incarnation).
std::string next_incarnation(const std::string& id);

// Whether the first generation forms now: every node is in, or MIN are and the last call (the
// time since the round began, `waited`, past `last_call`) is over. A pure function.
bool first_generation_due(int nodes_in, int min_nodes, int max_nodes, Clock::duration waited,
                          Clock::duration last_call);

struct ArbiterEvent {
  enum class Kind {
    kTick,        // time passed: the first generation's last call, a request's delay, the beats
    kNode,        // node `node`'s workers `ids` are in the job (node 0's: started; another
                  // node's: registered, after its start or a group restart)
    kRestarted,   // another node restarted a lost worker: ids[0], to join
    kLost,        // `ids` ended with an error: `what` (who and how), `exit_code` (the first's)
    kDone,        // `ids` ended with exit code 0
    kReady,       // the joiner ids[0] has started and waits to be taken in
    kHolds,       // ids[0] holds the committed state (its heal passed the digest check)
    kSpeaks,      // ids[0] speaks the protocol (ddp_train --elastic)
    kCheckpoint,  // the group wrote a checkpoint: `what` names it
    kReform,      // a member asked for the generation after the current one
    kBeat,        // node `node`'s beat counter reads `count`
  };
  Kind kind = Kind::kTick;
  std::vector<std::string> ids;
  Clock::time_point now = Clock::now();
  int node = 0;
  int64_t count = 0;
  std::string what;
  int exit_code = 1;
};

struct ArbiterAction {
  enum class Kind {
    kPublish,        // generation `generation` is `ids`, in rank order
    kAbortNotice,    // generation `generation` lost a member: `text` names it
    kGrow,           // the joiner ids[0] is ready: `generation` takes it in after its next step
    kAdmit,          // node `node` is in: its workers join a running group (`join`) or form the
                     // first generation of round `round`
    kRestartWorker,  // node 0: start ids[0], the next incarnation of a lost worker, to join
    kRestartGroup,   // every node: stop every worker, start them all again, fresh, as round
                     // `round` (they resume from the newest checkpoint); `text` says why
    kEnd,            // the job ends with `exit_code` (0: every member finished); `text` says why
    kNote,           // `text`, for the launcher's log
  };
  Kind kind = Kind::kNote;
  std::vector<std::string> ids;
  int64_t generation = 0;
  int node = 0;
  int round = 0;
  bool join = false;
  int exit_code = 0;
  std::string text;
};

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
  };
  Arbiter(Settings settings, Clock::time_point now);

  std::vector<ArbiterAction> on(const ArbiterEvent& event);

  enum class Phase { kForming, kRunning, kEnded };
  Phase phase() const { return phase_; }
  int round() const { return round_; }
  int64_t generation() const { return generation_; }
  const std::vector<std::string>& members() const { return members_; }
  // Started, not yet members: the ids whose readiness the service looks for.
  const std::vector<std::string>& joining() const { return joining_; }
  // Members and joiners not known to hold the committed state: whose elastic/holds/<id> the
  // service looks for before it reports a loss.
  std::vector<std::string> not_known_holders() const;
  bool speaks() const { return speaks_; }
  std::vector<int> other_nodes() const;  // every node but 0 ever in the job
  bool node_in(int node) const;          // in the job now (heard from within the node timeout)
  int restarts() const { return restarts_; }
  // "generation 2 of 3 worker(s): 0.0,1.1,2.0"
  std::string describe_generation() const;

 private:
  using Actions = std::vector<ArbiterAction>;
  struct Node {
    bool in = true;
    int64_t beat = -1;
    Clock::time_point heard;
  };
  void tick(Clock::time_point now, Actions& out);
  void form(Clock::time_point now, Actions& out);
  void drop_silent_nodes(Clock::time_point now, Actions& out);
  void node_in(const ArbiterEvent& e, Actions& out);
  void lose(const std::vector<std::string>& ids, const std::string& what, int exit_code,
            Clock::time_point now, Actions& out);
  void restart_lost_workers(const std::vector<std::string>& ids, Actions& out);
  void restart_group(const std::string& why, int exit_code, Clock::time_point now, Actions& out);
  void end(int exit_code, const std::string& why, Actions& out);
  void publish(Actions& out);
  void take_in_ready_joiners();
  bool holds_state(const std::string& id) const { return holders_.count(id) != 0; }
  bool any_holder() const;
  int nodes_in() const;
  std::string below_min() const;
  bool finished() const;

  Settings settings_;
  Phase phase_ = Phase::kForming;
  int round_ = 0;
  Clock::time_point round_began_;
  std::set<int> registered_;          // kForming: nodes whose workers are in this round
  std::vector<std::string> members_;  // kForming: the first generation so far
  std::vector<std::string> joining_;  // started to join, not yet members
  std::vector<std::string> ready_;    // of those, the ones that are ready
  std::set<std::string> done_;
  std::set<std::string> holders_;
  bool speaks_ = false;
  std::string checkpoint_;     // the newest the group wrote ("" : none)
  std::map<int, Node> nodes_;  // the other nodes, by node rank
  int64_t generation_ = -1;    // the last published
  std::optional<Clock::time_point> reform_seen_;
  int restarts_ = 0;
};

}  // namespace ddp::launch
