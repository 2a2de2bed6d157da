#pragma once
// Elastic membership: a worker's side of the protocol by which the launcher (`--nnodes MIN:MAX`,
// which serves the job's store and outlives its workers) tells the workers which of them form
// the group, generation after generation, and by which the members agree on every step.

// (Note [Elastic membership] in elastic_keys.h.)

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/elastic_keys.h"
#include "ddp/comm/process_group.h"
#include "ddp/comm/rendezvous.h"

namespace c10d {
class Store;
}

namespace ddp::comm {

struct Membership {
  int64_t generation = -1;
  std::vector<std::string> members;  // worker ids, in rank order
  int rank = -1;                     // this worker's position in `members`
  int world_size() const { return static_cast<int>(members.size()); }
};

// A worker's link to the launcher's arbiter (DDP_ELASTIC_ID in the environment: this worker's
// id, "<local rank>.<incarnation>"). Every call talks to the store; none is a collective.
class ElasticAgent {
 public:
  // Connects to the launcher's store (MASTER_ADDR:MASTER_PORT, DDP_JOB_TOKEN) as a client.
  ElasticAgent(const LaunchInfo& launch, std::string id, std::chrono::milliseconds timeout);
  virtual ~ElasticAgent();  // abandons the vote in flight

  const std::string& id() const { return id_; }
  // Blocks until the launcher has published a generation newer than `after` that includes this
  // worker (a worker left out of one waits for the next). Throws Error after `timeout`.
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
  // decision every member of `m` gets (Note [Elastic membership]).
  StepDecision vote(const Membership& m, int64_t round, bool ok);
  // An "ok" vote on round `round`, cast on a thread of its own while the caller goes on (the
  // trainer's next step computes meanwhile: Note [A step's vote travels during the next step]).
  // At most one is in flight: take_vote() first.
  void vote_in_background(const Membership& m, int64_t round);
  // The decision of the vote in flight (waiting for it), or nullopt when none is.
  std::optional<StepDecision> take_vote();
  // A member leaving its generation: the round in flight, if still undecided, is decided "abort"
  // (a member that will never vote on it must not keep the others' votes waiting), and its vote
  // is taken and dropped.
  void abandon_vote();
  // The launcher's notice that generation `g` lost a member (who, and how), or "" when it has
  // none (the generation ended for a joiner, or for a failure no death caused).
  std::string lost_in(int64_t g);
  // Asks the launcher for the generation after `m`.
  void request_next_generation(const Membership& m);
  // A joiner: ready to be taken into the next generation.
  void announce_ready();

 private:
  LaunchInfo launch_;
  std::string id_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;  // a StoreClient (store_client.h)
  // The vote in flight: its generation and round, and its decision to come.
  int64_t background_generation_ = -1;
  int64_t background_round_ = 0;
  std::future<StepDecision> background_;
};

}  // namespace ddp::comm
