#include "arbiter.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "ddp/common/error.h"

namespace ddp::launch {
namespace {

using comm::ElasticKeys;
using comm::NodeEvent;
using comm::StoreOp;

constexpr std::chrono::seconds kReplyWithin{30};  // node 0's own store, on this host
// A node's requests to node 0: short, so that a link that is down holds its launcher's loop
// (which relays the workers' output) for a second at most.
constexpr std::chrono::seconds kNodeReplyWithin{1};
constexpr auto kReformDelay = std::chrono::milliseconds(100);
constexpr auto kBeatEvery = std::chrono::milliseconds(100);

void remove(std::vector<std::string>& ids, const std::string& id) {
  ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
}

bool contains(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

double seconds_of(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

std::string elastic_worker_id(bool several_nodes, int node, int local_rank, int incarnation) {
  return several_nodes ? fmt::format("{}.{}.{}", node, local_rank, incarnation)
                       : fmt::format("{}.{}", local_rank, incarnation);
}

int node_of_worker(const std::string& id) {
  const size_t first = id.find('.');
  return id.find('.', first + 1) == std::string::npos ? 0 : std::stoi(id.substr(0, first));
}

int incarnation_of_worker(const std::string& id) {
  return std::stoi(id.substr(id.rfind('.') + 1));
}

bool first_generation_due(int nodes_in, int min_nodes, int max_nodes, Clock::duration waited,
                          Clock::duration last_call) {
  return nodes_in >= max_nodes || (nodes_in >= min_nodes && waited >= last_call);
}

Arbiter::Arbiter(comm::StoreConnection& store, Settings settings,
                 std::vector<std::string> local_ids, Notes note)
    : store_(store), settings_(settings), note_(std::move(note)), members_(std::move(local_ids)) {}

void Arbiter::set(const std::string& key, const std::string& value) {
  store_.request({StoreOp::kSet, {key, value}}, kReplyWithin);
}
bool Arbiter::has(const std::string& key) {
  return store_.request({StoreOp::kCheck, {key}}, kReplyWithin).fields.at(0) == "1";
}
int64_t Arbiter::add(const std::string& key, int64_t delta) {
  return comm::parse_integer(
      store_.request({StoreOp::kAdd, {key, std::to_string(delta)}}, kReplyWithin).fields.at(0));
}
std::string Arbiter::get(const std::string& key) {
  return store_.request({StoreOp::kGet, {key, "0"}}, kReplyWithin).fields.at(0);
}

void Arbiter::publish() {
  set(ElasticKeys::generation(generation_), comm::format_members(members_));
  set(ElasticKeys::latest(), std::to_string(generation_));
}

bool Arbiter::lose(const std::string& id, const std::string& what) {
  return lose_all({id}, what);
}

// Out of the group at once: one generation without all of `ids`, whose step in flight is aborted.
bool Arbiter::lose_all(const std::vector<std::string>& ids, const std::string& what) {
  std::vector<std::string> ranks;
  for (const auto& id : ids) {
    remove(joining_, id);
    remove(ready_, id);
    const auto it = std::find(members_.begin(), members_.end(), id);
    if (it != members_.end()) ranks.push_back(std::to_string(it - members_.begin()));
  }
  if (ranks.empty()) return false;
  for (const auto& id : ids) remove(members_, id);
  if (!formed_) return true;  // the first generation is not published yet
  set(ElasticKeys::abort(generation_),
      fmt::format("{} {} of generation {}, {}", ranks.size() == 1 ? "rank" : "ranks",
                  fmt::join(ranks, ","), generation_, what));
  ++generation_;
  reform_seen_.reset();
  publish();
  return true;
}

void Arbiter::join(const std::string& id) {
  joining_.push_back(id);
}

void Arbiter::done(const std::string& id) {
  done_.insert(id);
}

bool Arbiter::finished() const {
  return formed_ && !members_.empty() &&
         std::all_of(members_.begin(), members_.end(),
                     [&](const std::string& id) { return done_.count(id) != 0; });
}

int Arbiter::nodes_in() const {
  return 1 + static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(),
                                            [](const auto& n) { return n.second.in; }));
}

std::string Arbiter::below_min() const {
  if (!formed_) return "";
  const int in = nodes_in();
  if (in >= settings_.min_nodes) return "";
  return fmt::format("{} node(s) left in the job, fewer than the {} of --nnodes {}:{}", in,
                     settings_.min_nodes, settings_.min_nodes, settings_.max_nodes);
}

void Arbiter::poll() {
  read_events();
  check_beats();
  if (!formed_) {
    const int in = nodes_in();
    if (!first_generation_due(in, settings_.min_nodes, settings_.max_nodes, Clock::now() - started_,
                              settings_.node_timeout)) {
      return;
    }
    formed_ = true;
    publish();
    if (settings_.max_nodes > 1) {
      note_(fmt::format("elastic: generation 0 of {} worker(s) on {} node(s): {}", members_.size(),
                        in, comm::format_members(members_)));
    }
    return;
  }
  take_ready_joiners();
  if (!reform_seen_) {
    if (!has(ElasticKeys::reform(generation_))) return;
    reform_seen_ = Clock::now();
  }
  if (Clock::now() - *reform_seen_ < kReformDelay) return;
  reform_seen_.reset();
  for (const auto& id : ready_) {
    members_.push_back(id);
    remove(joining_, id);
  }
  ready_.clear();
  ++generation_;
  publish();
  note_(fmt::format("elastic: generation {} of {} worker(s): {}", generation_, members_.size(),
                    comm::format_members(members_)));
}

void Arbiter::take_ready_joiners() {
  for (const auto& id : joining_) {
    if (contains(ready_, id) || !has(ElasticKeys::ready(id))) continue;
    ready_.push_back(id);
    set(ElasticKeys::grow(generation_), id);
  }
}

void Arbiter::read_events() {
  if (settings_.max_nodes == 1) return;
  const int64_t written = add(ElasticKeys::events(), 0);
  // An event is numbered before it is written: one not written yet is read at the next poll. A
  // number whose reply its node never got (the link failed then) stays a hole: it is passed over
  // after the node timeout.
  while (events_read_ < written) {
    const std::string key = ElasticKeys::event(events_read_ + 1);
    if (!has(key)) {
      if (!hole_since_) hole_since_ = Clock::now();
      if (Clock::now() - *hole_since_ < settings_.node_timeout) return;
      ++events_read_;
      hole_since_.reset();
      continue;
    }
    hole_since_.reset();
    ++events_read_;
    on_event(comm::parse_event(get(key)));
  }
}

void Arbiter::on_event(const NodeEvent& e) {
  switch (e.kind) {
    case NodeEvent::Kind::kNode: {
      Node& node = nodes_[e.node];
      node = Node{true, -1, Clock::now()};
      for (const auto& id : comm::parse_members(e.ids))
        (formed_ ? joining_ : members_).push_back(id);
      set(ElasticKeys::admitted(e.node), formed_ ? "join" : "initial");
      note_(fmt::format("elastic: node {} is in the job with worker(s) {}{}", e.node, e.ids,
                        formed_ ? ", which join the running group" : ""));
      break;
    }
    case NodeEvent::Kind::kJoin:
      join(e.ids);
      break;
    case NodeEvent::Kind::kLost:
      if (lose(e.ids, e.what)) {
        note_(fmt::format(
            "elastic: node {}'s worker {} lost: {}; generation {} of {} worker(s): {}", e.node,
            e.ids, e.what, generation_, members_.size(), comm::format_members(members_)));
      }
      break;
    case NodeEvent::Kind::kDone:
      done(e.ids);
      break;
  }
}

// Each node beats every 100 ms; one whose beat stood still for the node timeout is out of the job
// with its workers, and back when its beats resume.
void Arbiter::check_beats() {
  const auto now = Clock::now();
  if (nodes_.empty() || now - beats_checked_ < kBeatEvery) return;
  beats_checked_ = now;
  for (auto& [n, node] : nodes_) {
    const int64_t beat = add(ElasticKeys::beat(n), 0);
    if (beat != node.beat) {
      if (!node.in) note_(fmt::format("elastic: node {} is back", n));
      node.in = true;
      node.beat = beat;
      node.heard = now;
    } else if (node.in && now - node.heard > settings_.node_timeout) {
      node.in = false;
      drop_node(n, now - node.heard);
    }
  }
}

void Arbiter::drop_node(int node, Clock::duration silent) {
  std::vector<std::string> ids;
  for (const auto* list : {&members_, &joining_}) {
    for (const auto& id : *list) {
      if (node_of_worker(id) == node) ids.push_back(id);
    }
  }
  const std::string what =
      fmt::format("node {}: not heard from for {:.1f} s (its link or its launcher is down)", node,
                  seconds_of(silent));
  const bool members = lose_all(ids, what);
  note_(fmt::format("elastic: {}{}", what,
                    members ? fmt::format("; generation {} of {} worker(s): {}", generation_,
                                          members_.size(), comm::format_members(members_))
                            : ""));
}

void Arbiter::announce_end(const std::string& how, Clock::duration within) {
  set(ElasticKeys::finished(), how);
  const auto deadline = Clock::now() + within;
  for (const auto& [n, node] : nodes_) {
    while (node.in && Clock::now() < deadline && !has(ElasticKeys::bye(n))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

NodeLink::NodeLink(std::string host, int port, std::string token, int node,
                   Clock::duration node_timeout, Notes note)
    : host_(std::move(host)),
      port_(port),
      token_(std::move(token)),
      node_(node),
      node_timeout_(node_timeout),
      note_(std::move(note)) {}

// Any failure drops the connection; the next request makes a new one.
comm::StoreMessage NodeLink::request(const comm::StoreMessage& message) {
  try {
    if (!store_) store_.emplace(host_, port_, token_, kNodeReplyWithin);
    comm::StoreMessage reply = store_->request(message, kNodeReplyWithin);
    reached_ = Clock::now();
    return reply;
  } catch (const InputError&) {
    throw;  // refused (another job's store): no retry helps
  } catch (const Error&) {
    store_.reset();
    throw;
  }
}

std::optional<bool> NodeLink::register_node(const std::vector<std::string>& ids,
                                            Clock::duration within,
                                            const std::function<bool()>& stop) {
  const auto deadline = Clock::now() + within;
  report({NodeEvent::Kind::kNode, node_, comm::format_members(ids), ""});
  while (Clock::now() < deadline && !stop()) {
    try {
      tick();
      if (all_sent() &&
          request({StoreOp::kCheck, {ElasticKeys::admitted(node_)}}).fields.at(0) == "1") {
        return request({StoreOp::kGet, {ElasticKeys::admitted(node_), "0"}}).fields.at(0) == "join";
      }
    } catch (const InputError&) {
      throw;
    } catch (const Error&) {
      // node 0 is not up yet, or cannot be reached: again
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (stop()) return std::nullopt;
  throw Error(
      fmt::format("node {}: node 0's launcher at {}:{} did not admit this node within {:.0f} s",
                  node_, host_, port_, seconds_of(within)));
}

void NodeLink::report(NodeEvent event) {
  outbox_.push_back(std::move(event));
}

std::optional<std::string> NodeLink::tick() {
  try {
    request({StoreOp::kAdd, {ElasticKeys::beat(node_), "1"}});
    if (was_cut_off_)
      note_(fmt::format("elastic: node 0 can be reached again from node {}", node_));
    was_cut_off_ = false;
    while (!outbox_.empty()) {
      // The number is kept until the event is written under it: the arbiter reads them in order.
      if (!numbered_) {
        numbered_ = comm::parse_integer(
            request({StoreOp::kAdd, {ElasticKeys::events(), "1"}}).fields.at(0));
      }
      request(
          {StoreOp::kSet, {ElasticKeys::event(*numbered_), comm::format_event(outbox_.front())}});
      numbered_.reset();
      outbox_.pop_front();
    }
    if (request({StoreOp::kCheck, {ElasticKeys::finished()}}).fields.at(0) == "1") {
      const std::string how = request({StoreOp::kGet, {ElasticKeys::finished(), "0"}}).fields.at(0);
      request({StoreOp::kSet, {ElasticKeys::bye(node_), "1"}});
      return how;
    }
  } catch (const InputError&) {
    throw;
  } catch (const Error& e) {
    if (!was_cut_off_ && cut_off()) {
      note_(fmt::format("elastic: node 0 ({}:{}) not reached from node {} for {:.1f} s: {}", host_,
                        port_, node_, seconds_of(Clock::now() - reached_), e.what()));
      was_cut_off_ = true;
    }
  }
  return std::nullopt;
}

}  // namespace ddp::launch
