#include "arbiter_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "ddp/comm/elastic/elastic_keys.h"

namespace ddp::launch {
namespace {

using comm::ElasticKeys;
using comm::NodeEvent;
using comm::StoreOp;
using Kind = ArbiterEvent::Kind;
using Do = ArbiterAction::Kind;

constexpr std::chrono::seconds kReplyWithin{30};  // node 0's own store, on this host
constexpr auto kBeatEvery = std::chrono::milliseconds(100);

ArbiterEvent event(Kind kind, std::vector<std::string> ids = {}) {
  ArbiterEvent e;
  e.kind = kind;
  e.ids = std::move(ids);
  return e;
}

}  // namespace

ArbiterService::ArbiterService(comm::StoreConnection& store, Arbiter::Settings settings, Notes note)
    : store_(store),
      arbiter_(settings, Clock::now()),
      several_nodes_(settings.max_nodes > 1),
      note_(std::move(note)),
      node_timeout_(settings.node_timeout) {}

void ArbiterService::set(const std::string& key, const std::string& value) {
  store_.request({StoreOp::kSet, {key, value}}, kReplyWithin);
}
bool ArbiterService::has(const std::string& key) {
  return store_.request({StoreOp::kCheck, {key}}, kReplyWithin).fields.at(0) == "1";
}
int64_t ArbiterService::add(const std::string& key, int64_t delta) {
  return comm::parse_integer(
      store_.request({StoreOp::kAdd, {key, std::to_string(delta)}}, kReplyWithin).fields.at(0));
}
std::string ArbiterService::get(const std::string& key) {
  return store_.request({StoreOp::kGet, {key, "0"}}, kReplyWithin).fields.at(0);
}

std::vector<ArbiterAction> ArbiterService::feed(const ArbiterEvent& e) {
  std::vector<ArbiterAction> left;
  for (ArbiterAction& a : arbiter_.on(e)) {
    switch (a.kind) {
      case Do::kPublish:
        set(ElasticKeys::generation(a.generation), comm::format_members(a.ids));
        set(ElasticKeys::latest(), std::to_string(a.generation));
        break;
      case Do::kAbortNotice:
        set(ElasticKeys::abort(a.generation), a.text);
        break;
      case Do::kGrow:
        set(ElasticKeys::grow(a.generation), a.ids.at(0));
        break;
      case Do::kAdmit:
        set(ElasticKeys::admitted(a.node, a.round), a.join ? "join" : "initial");
        break;
      case Do::kNote:
        note_(a.text);
        break;
      case Do::kRestartGroup:
        set(ElasticKeys::round(), std::to_string(a.round));  // the other nodes follow
        left.push_back(std::move(a));
        break;
      case Do::kRestartWorker:
      case Do::kEnd:
        left.push_back(std::move(a));
        break;
    }
  }
  return left;
}

std::vector<ArbiterAction> ArbiterService::start_round(const std::vector<std::string>& ids,
                                                       int worker_port) {
  set(ElasticKeys::worker_port(arbiter_.round()), std::to_string(worker_port));
  ArbiterEvent e = event(Kind::kNode, ids);
  e.node = 0;
  return feed(e);
}

// What the workers said of themselves: read before a loss is decided (whether the worker lost had
// left its training loop decides what its loss is), and every 100 ms (a node's silence is decided
// within a poll).
void ArbiterService::refresh() {
  refreshed_ = Clock::now();
  if (!arbiter_.speaks()) {
    for (const auto* list : {&arbiter_.members(), &arbiter_.joining()}) {
      for (const auto& id : *list) {
        if (has(ElasticKeys::speaks(id))) {
          feed(event(Kind::kSpeaks, {id}));
          break;
        }
      }
      if (arbiter_.speaks()) break;
    }
  }
  for (const auto& id : arbiter_.not_known_holders()) {
    if (has(ElasticKeys::holds(id))) feed(event(Kind::kHolds, {id}));
  }
  // One read a refresh, not one a member, until a worker says it left its training loop.
  if (const int64_t trained = add(ElasticKeys::trained_count(), 0); trained != trained_seen_) {
    trained_seen_ = trained;
    // Copied: a member out of its training loop leaves members().
    for (const auto& id : std::vector<std::string>(arbiter_.members())) {
      if (has(ElasticKeys::trained(id))) feed(event(Kind::kTrained, {id}));
    }
  }
  if (has(ElasticKeys::checkpoint())) {
    ArbiterEvent e = event(Kind::kCheckpoint);
    e.what = get(ElasticKeys::checkpoint());
    feed(e);
  }
}

std::vector<ArbiterAction> ArbiterService::lost(const std::vector<std::string>& ids,
                                                const std::string& what, int exit_code) {
  refresh();
  ArbiterEvent e = event(Kind::kLost, ids);
  e.what = what;
  e.exit_code = exit_code;
  return feed(e);
}

std::vector<ArbiterAction> ArbiterService::done(const std::vector<std::string>& ids) {
  return feed(event(Kind::kDone, ids));
}

std::vector<ArbiterAction> ArbiterService::poll() {
  std::vector<ArbiterAction> out;
  auto keep = [&out](std::vector<ArbiterAction> more) {
    for (auto& a : more) out.push_back(std::move(a));
  };
  read_events(out);
  read_beats(out);
  if (Clock::now() - refreshed_ >= kBeatEvery) refresh();
  for (const auto& id : arbiter_.joining()) {
    if (has(ElasticKeys::ready(id))) keep(feed(event(Kind::kReady, {id})));
  }
  if (arbiter_.phase() == Arbiter::Phase::kRunning &&
      has(ElasticKeys::reform(arbiter_.generation()))) {
    keep(feed(event(Kind::kReform)));
  }
  keep(feed(event(Kind::kTick)));
  return out;
}

void ArbiterService::read_events(std::vector<ArbiterAction>& out) {
  if (!several_nodes_) return;
  const int64_t written = add(ElasticKeys::events(), 0);
  // An event is numbered before it is written: one not written yet is read at the next poll. A
  // number whose reply its node never got (the link failed then) stays a hole: it is passed over
  // after the node timeout.
  while (events_read_ < written) {
    const std::string key = ElasticKeys::event(events_read_ + 1);
    if (!has(key)) {
      if (!hole_since_) hole_since_ = Clock::now();
      if (Clock::now() - *hole_since_ < node_timeout_) return;
      ++events_read_;
      hole_since_.reset();
      continue;
    }
    hole_since_.reset();
    ++events_read_;
    const NodeEvent n = comm::parse_event(get(key));
    ArbiterEvent e = event(Kind::kTick, comm::parse_members(n.ids));
    e.node = n.node;
    switch (n.kind) {
      case NodeEvent::Kind::kNode:
        e.kind = Kind::kNode;
        break;
      case NodeEvent::Kind::kJoin:
        e.kind = Kind::kRestarted;
        break;
      case NodeEvent::Kind::kLost:
        refresh();
        e.kind = Kind::kLost;
        e.what = n.what;
        break;
      case NodeEvent::Kind::kDone:
        e.kind = Kind::kDone;
        break;
    }
    const int64_t before = arbiter_.generation();
    for (auto& a : feed(e)) out.push_back(std::move(a));
    if (e.kind == Kind::kLost) {
      const bool published =
          arbiter_.phase() == Arbiter::Phase::kRunning && arbiter_.generation() != before;
      note_(fmt::format("elastic: node {}'s worker {} lost: {}{}", n.node, n.ids, n.what,
                        published ? "; " + arbiter_.describe_generation() : ""));
    }
  }
}

void ArbiterService::read_beats(std::vector<ArbiterAction>& out) {
  const auto now = Clock::now();
  const std::vector<int> nodes = arbiter_.other_nodes();
  if (nodes.empty() || now - beats_read_ < kBeatEvery) return;
  beats_read_ = now;
  for (int n : nodes) {
    ArbiterEvent e = event(Kind::kBeat);
    e.node = n;
    e.count = add(ElasticKeys::beat(n), 0);
    for (auto& a : feed(e)) out.push_back(std::move(a));
  }
}

void ArbiterService::announce_end(const std::string& how, Clock::duration within) {
  set(ElasticKeys::finished(), how);
  const auto deadline = Clock::now() + within;
  for (int n : arbiter_.other_nodes()) {
    while (arbiter_.node_in(n) && Clock::now() < deadline && !has(ElasticKeys::bye(n))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace ddp::launch
