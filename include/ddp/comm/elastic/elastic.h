#pragma once
// Elastic membership: a worker's side of the protocol by which the launcher (`--nnodes MIN:MAX`,
// which serves the job's store and outlives its workers) tells the workers which of them form
// the group, generation after generation, and by which the members agree on every step.

// (Note [Elastic membership] in elastic_keys.h.)

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/elastic/elastic_keys.h"
#include "ddp/comm/launch_info.h"
#include "ddp/comm/process_group.h"

namespace c10d {
class Store;
}

namespace ddp::comm {

class JobThread;

struct Membership {
  int64_t generation = -1;
  std::vector<std::string> members;  // worker ids, in rank order
  int rank = -1;                     // this worker's position in `members`
  int world_size() const { return static_cast<int>(members.size()); }
};

struct ElasticAgentOptions {
  // The launcher's store (DDP_ELASTIC_STORE, "host:port"; the secret DDP_JOB_TOKEN).
  std::string store_host;
  int store_port = 0;
  std::string token;
  // How long a worker waits for the launcher's next generation, and for a group to connect.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // How long a member waits for a step's decision (the others' votes): the collective timeout.
  std::chrono::milliseconds vote_timeout{std::chrono::minutes(10)};
};

// A worker's link to the launcher's arbiter (DDP_ELASTIC_ID in the environment: this worker's
// id, "<local rank>.<incarnation>"). Every call talks to the store; none is a collective.
class ElasticAgent {
 public:
  // Connects to the launcher's store as a client and says this worker speaks the protocol
  // (elastic/speaks/<id>: the launcher then restarts a lost worker alone, not the group).
  ElasticAgent(const LaunchInfo& launch, std::string id, ElasticAgentOptions options);
  virtual ~ElasticAgent();  // abandons the vote in flight

  const std::string& id() const { return id_; }
  const ElasticAgentOptions& options() const { return options_; }
  // Blocks until the launcher has published a generation newer than `after` that includes this
  // worker (a worker left out of one waits for the next). Throws Error after `timeout`, unless
  // this joiner's grow is due (Note [A joiner's place is kept while its grow is due]).
  Membership next_membership(int64_t after);
  // The group of `m` on `backend` (gloo, or nccl for CUDA tensors): connected over the prefix
  // elastic/gen/<g>/group of the store. Throws CommError when a member does not connect, or at
  // once when the launcher aborts `m` (a member died); an nccl group also aborts its
  // communicator then, releasing collectives in flight. Virtual so that a program can decorate
  // each generation's group (as the tests' fault injector does).
  virtual std::unique_ptr<ProcessGroup> make_group(const Membership& m,
                                                   const ProcessGroupOptions& options,
                                                   const std::string& backend);
  // This member's vote on round `round` of generation `m` (`ok`: its step went well); returns the
  // decision every member of `m` gets (Note [Elastic membership]). A decision that does not come
  // within the vote timeout is "abort", with a warning naming the members whose votes were
  // missing. Virtual so that a test program can make a vote fail after it was counted.
  virtual StepDecision vote(const Membership& m, int64_t round, bool ok);
  // An "ok" vote on round `round`, cast on a thread of its own while the caller goes on (the
  // trainer's next step computes meanwhile: Note [A step's vote travels during the next step]).
  // At most one is in flight: take_vote() first. Virtual, as vote().
  virtual void vote_in_background(const Membership& m, int64_t round);
  // The decision of the vote in flight (waiting for it), or nullopt when none is.
  std::optional<StepDecision> take_vote();
  // A member leaving its generation: the round in flight, if still undecided, is decided "abort"
  // (a member that will never vote on it must not keep the others' votes waiting), and its vote
  // is taken and dropped.
  void abandon_vote();
  // The launcher's notice that generation `g` lost a member (who, and how), or "" when it has
  // none (the generation ended for a joiner, or for a failure no death caused).
  std::string lost_in(int64_t g);
  // This member leaves generation `m` because something failed (`why`): the notice that ends
  // the others' waits on `m` and aborts their nccl communicators, unless one is there already
  // (the launcher's of a death, another member's).
  void report_failure(const Membership& m, const std::string& why);
  // Asks the launcher for the generation after `m`.
  void request_next_generation(const Membership& m);
  // A joiner: ready to be taken into the next generation.
  void announce_ready();
  // This worker holds the group's committed state (its heal passed the digest check).
  void announce_holds();
  // This worker left its training loop, after its last collective: no generation after its last
  // can have it.
  void announce_trained();
  // The group wrote a checkpoint (`which`): the launcher's way back if the state is lost.
  void announce_checkpoint(const std::string& which);

 private:
  // `make()`'s group, made on a thread of its own; CommError at once when the launcher gives `m`
  // up meanwhile (Note [A generation's connection is left behind when it is given up]).
  using GroupMaker = std::function<std::unique_ptr<ProcessGroup>()>;
  std::unique_ptr<ProcessGroup> unless_given_up(const Membership& m, GroupMaker make);

  // Which of `m`'s members have not voted on `round`: "rank 1 (worker 1.0), rank 2 (...)".
  std::string missing_votes(const Membership& m, int64_t round);
  // A ready joiner: the newest generation grows, and is not given up.
  bool grow_due();

  LaunchInfo launch_;
  std::string id_;
  ElasticAgentOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;  // a StoreClient (store_client.h)
  bool ready_ = false;                     // announce_ready() was called
  bool told_grow_due_ = false;             // grow_due() logged that the wait runs on
  // The vote in flight: its generation and round, and its decision to come.
  int64_t background_generation_ = -1;
  int64_t background_round_ = 0;
  std::shared_future<void> background_;
  StepDecision background_decision_ = StepDecision::kAbort;
  // The thread the votes run on, one at a time: one for the agent's life, not one a step.
  std::unique_ptr<JobThread> voter_;
};

}  // namespace ddp::comm
