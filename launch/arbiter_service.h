#pragma once
// Node 0's side of elastic membership: the Arbiter (arbiter.h) fed from the job's store, whose
// decisions on the store it writes there. What concerns processes (a worker to restart, every
// worker to start again, the job's end) it returns to the supervisor.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "arbiter.h"
#include "ddp/comm/elastic/elastic_keys.h"
#include "ddp/comm/store/store_connection.h"

namespace ddp::launch {

using Notes = std::function<void(const std::string&)>;

class ArbiterService {
 public:
  ArbiterService(comm::StoreConnection& store, Arbiter::Settings settings, Notes note);

  // Node 0's workers `ids`, started for the arbiter's current round, whose rendezvous port (their
  // MASTER_PORT: a program that is not ddp_train --elastic forms its own group there) is
  // `worker_port`; the other nodes' workers are given the same.
  std::vector<ArbiterAction> start_round(const std::vector<WorkerId>& ids, int worker_port);
  // Workers of node 0 that ended: with an error (`what`: who and how; `exit_code`: the first's),
  // or with exit 0.
  std::vector<ArbiterAction> lost(const std::vector<WorkerId>& ids, const std::string& what,
                                  int exit_code);
  std::vector<ArbiterAction> done(const std::vector<WorkerId>& ids);
  // What the others wrote since the last call (the nodes' events and beats, the joiners'
  // readiness, the members' requests for the next generation), and the time that passed.
  std::vector<ArbiterAction> poll();

  const Arbiter& arbiter() const { return arbiter_; }
  // Tells the other nodes that the job ended (`how`: "done" or "failed: ..."), and waits until
  // each node still in it has read that, at most `within` (their workers use the store until then).
  void announce_end(const std::string& how, Clock::duration within);

 private:
  // Feeds `event` to the arbiter at the clock's time, writes the actions on the store, logs the
  // notes; returns the others (the supervisor's).
  std::vector<ArbiterAction> feed(const ArbiterEvent& event);
  // `decided` written on the store or logged; false when it is the supervisor's.
  bool carry_out(const ArbiterAction& decided);
  void refresh();  // who holds the state, whether the workers speak the protocol, the checkpoint
  void read_events(std::vector<ArbiterAction>& out);
  void read_event(const comm::NodeEvent& n, std::vector<ArbiterAction>& out);
  void read_beats(std::vector<ArbiterAction>& out);
  void set(const std::string& key, const std::string& value);
  bool has(const std::string& key);
  int64_t add(const std::string& key, int64_t delta);
  std::string get(const std::string& key);

  comm::StoreConnection& store_;
  Arbiter arbiter_;
  bool several_nodes_;
  Notes note_;
  int64_t events_read_ = 0;
  std::optional<Clock::time_point> hole_since_;  // since when the next event is missing
  Clock::duration node_timeout_;
  Clock::time_point beats_read_;
  Clock::time_point refreshed_;
  int64_t trained_seen_ = 0;  // elastic/trained_count at the last refresh
};

}  // namespace ddp::launch
