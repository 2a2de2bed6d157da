#pragma once
// A node other than node 0, under elastic membership (Note [Elastic nodes] in
// ddp/comm/elastic/elastic_keys.h): its launcher's link to node 0's arbiter, through the job's
// store.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "arbiter.h"
#include "ddp/comm/elastic/elastic_keys.h"
#include "ddp/comm/store/store_connection.h"

namespace ddp::launch {

using Notes = std::function<void(const std::string&)>;

// Every call returns at once or within a second: while node 0 cannot be reached, the link says so
// and keeps what it has to tell.
class NodeLink {
 public:
  NodeLink(std::string host, int port, std::string token, int node, Clock::duration node_timeout,
           Notes note);
  struct Admission {
    bool join = false;    // the workers join a running group (else: the first generation)
    int worker_port = 0;  // their MASTER_PORT, node 0's choice for the round
  };
  // Registers this node's workers `ids` for round `round` and returns how they are admitted.
  // Retries until `within`, or until `stop` says so (nullopt).
  std::optional<Admission> register_node(const std::vector<WorkerId>& ids, int round,
                                         Clock::duration within, const std::function<bool()>& stop);
  void report(comm::NodeEvent event);  // sent in order, as soon as node 0 can be reached
  struct News {
    std::optional<std::string> ended;  // the job's end ("done" or "failed: ..."), read
    std::optional<int> round;          // every worker starts again, for this round
  };
  // Beats, sends what is waiting, and reads what node 0 decided for every node.
  News tick();
  // Node 0 has not been reached for the node timeout: the arbiter has dropped this node.
  bool cut_off() const { return silent() > node_timeout_; }
  Clock::duration silent() const { return Clock::now() - reached_; }  // since node 0 was reached
  bool all_sent() const { return outbox_.empty(); }

 private:
  comm::StoreMessage request(const comm::StoreMessage& message);
  std::optional<std::string> value_of(const std::string& key);

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
  int round_ = 0;  // the last this node followed
};

}  // namespace ddp::launch
