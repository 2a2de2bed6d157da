#pragma once
// The launchers' side of elastic membership (Note [Elastic membership] and Note [Elastic nodes]
// in ddp/comm/elastic_keys.h): node 0's arbiter, which decides the generations, and the other
// nodes' link to it. Both talk to the job's store only; the supervisor starts and reaps the
// workers and tells them what happened.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ddp/comm/elastic_keys.h"
#include "store_connection.h"

namespace ddp::launch {

using Clock = std::chrono::steady_clock;
using Notes = std::function<void(const std::string&)>;

// A worker's id: "<local rank>.<incarnation>" on one node, "<node>.<local rank>.<incarnation>" on
// several. Pure functions.
std::string elastic_worker_id(bool several_nodes, int node, int local_rank, int incarnation);
int node_of_worker(const std::string& id);         // 0 for an id of one node
int incarnation_of_worker(const std::string& id);  // the last number

// Whether the first generation forms now: every node is in, or MIN are and the last call (the
// time since the arbiter started, `waited`, past `last_call`) is over. A pure function.
bool first_generation_due(int nodes_in, int min_nodes, int max_nodes, Clock::duration waited,
                          Clock::duration last_call);

class Arbiter {
 public:
  struct Settings {
    int min_nodes = 1;
    int max_nodes = 1;
    Clock::duration node_timeout =
        std::chrono::seconds(15);  // also the first generation's last call
  };
  // `local_ids`: node 0's workers, in the first generation.
  Arbiter(comm::StoreConnection& store, Settings settings, std::vector<std::string> local_ids,
          Notes note);

  // A worker ended with an error (`what`: who, and how): when it was a member, the step in flight
  // is aborted (the abort notice says who was lost) and the next generation published at once.
  // Returns whether it was a member.
  bool lose(const std::string& id, const std::string& what);
  void join(const std::string& id);  // restarted: joins when it says it is ready
  void done(const std::string& id);  // ended with exit 0
  // What the others wrote since the last call: the nodes' events and beats, the members' requests
  // for the next generation, the joiners' readiness. Forms and publishes generations.
  void poll();

  int64_t generation() const { return generation_; }
  const std::vector<std::string>& members() const { return members_; }
  // Every member ended with exit 0: the training is over.
  bool finished() const;
  // No member, no joiner, and no first generation to wait for.
  bool nobody_left() const { return formed_ && members_.empty() && joining_.empty(); }
  // Fewer than MIN nodes are in the job: why; else "".
  std::string below_min() const;
  // Tells the other nodes that the job ended (`how`: "done" or "failed: ..."), and waits until
  // each node still in it has read that, at most `within` (their workers use the store until then).
  void announce_end(const std::string& how, Clock::duration within);

 private:
  struct Node {
    bool in = true;
    int64_t beat = -1;
    Clock::time_point heard;
  };
  int nodes_in() const;  // node 0 and the other nodes in the job
  void set(const std::string& key, const std::string& value);
  bool has(const std::string& key);
  int64_t add(const std::string& key, int64_t delta);
  std::string get(const std::string& key);
  void publish();
  bool lose_all(const std::vector<std::string>& ids, const std::string& what);
  void read_events();
  void on_event(const comm::NodeEvent& event);
  void check_beats();
  void drop_node(int node, Clock::duration silent);
  void take_ready_joiners();

  comm::StoreConnection& store_;
  Settings settings_;
  Notes note_;
  Clock::time_point started_ = Clock::now();
  bool formed_ = false;
  std::vector<std::string> members_;  // before the first generation: its members so far
  std::vector<std::string> joining_;  // restarted (or of a late node), not yet a member
  std::vector<std::string> ready_;    // of those, the ones that announced they are ready
  std::set<std::string> done_;
  std::map<int, Node> nodes_;  // the other nodes, by node rank
  int64_t events_read_ = 0;
  std::optional<Clock::time_point> hole_since_;  // since when the next event is missing
  Clock::time_point beats_checked_;
  int64_t generation_ = 0;
  // When a member's request for the next generation was first seen: it is granted 100 ms later,
  // so that a member whose death made the others ask is reaped first and left out (its sockets
  // close as it dies, a moment before it can be reaped).
  std::optional<Clock::time_point> reform_seen_;
};

// A node other than node 0: its launcher's link to the arbiter. Every call returns at once or
// within a second: while node 0 cannot be reached, the link says so and keeps what it has to tell.
class NodeLink {
 public:
  NodeLink(std::string host, int port, std::string token, int node, Clock::duration node_timeout,
           Notes note);
  // Registers this node's workers `ids` and returns whether they join a running group (else they
  // are in the first generation). Retries until `within`, or until `stop` says so (nullopt).
  std::optional<bool> register_node(const std::vector<std::string>& ids, Clock::duration within,
                                    const std::function<bool()>& stop);
  void report(comm::NodeEvent event);  // sent in order, as soon as node 0 can be reached
  // Beats, and sends what is waiting; returns the job's end ("done" or "failed: ...") once node 0
  // has announced it (and says it read it).
  std::optional<std::string> tick();
  // Node 0 has not been reached for the node timeout: the arbiter has dropped this node.
  bool cut_off() const { return silent() > node_timeout_; }
  Clock::duration silent() const { return Clock::now() - reached_; }  // since node 0 was reached
  bool all_sent() const { return outbox_.empty(); }

 private:
  comm::StoreMessage request(const comm::StoreMessage& message);

  std::string host_;
  int port_;
  std::string token_;
  int node_;
  Clock::duration node_timeout_;
  Notes note_;
  std::optional<comm::StoreConnection> store_;
  Clock::time_point reached_ = Clock::now();
  std::deque<comm::NodeEvent> outbox_;
  std::optional<int64_t> numbered_;  // the number the arbiter gave outbox_'s first event
  bool was_cut_off_ = false;
};

}  // namespace ddp::launch
