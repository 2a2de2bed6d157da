#include "arbiter_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>
#include <variant>

#include "ddp/comm/elastic/elastic_keys.h"

namespace ddp::launch {
namespace {

using comm::ElasticKeys;
using comm::NodeEvent;
using comm::StoreOp;

constexpr std::chrono::seconds kReplyWithin{30};  // node 0's own store, on this host
constexpr auto kBeatEvery = std::chrono::milliseconds(100);

// A node's event (Note [Elastic nodes]) as the arbiter's.
ArbiterEvent arbiter_event(const NodeEvent& n) {
  std::vector<WorkerId> ids = parse_worker_ids(n.ids);
  switch (n.kind) {
    case NodeEvent::Kind::kNode:
      return event::NodeIn{n.node, std::move(ids)};
    case NodeEvent::Kind::kJoin:
      return event::Restarted{std::move(ids)};
    case NodeEvent::Kind::kLost:
      return event::Lost{std::move(ids), n.what, 1};
    case NodeEvent::Kind::kDone:
      break;
  }
  return event::Done{std::move(ids)};  // kDone
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

std::vector<ArbiterAction> ArbiterService::feed(const ArbiterEvent& event) {
  std::vector<ArbiterAction> left;
  for (ArbiterAction& a : arbiter_.on(event, Clock::now())) {
    if (!carry_out(a)) left.push_back(std::move(a));
  }
  return left;
}

bool ArbiterService::carry_out(const ArbiterAction& decided) {
  const auto write = Overloaded{
      [&](const action::Publish& a) {
        set(ElasticKeys::generation(a.generation), to_string(a.members));
        set(ElasticKeys::latest(), std::to_string(a.generation));
        return true;
      },
      [&](const action::AbortNotice& a) {
        set(ElasticKeys::abort(a.generation), a.text);
        return true;
      },
      [&](const action::Grow& a) {
        set(ElasticKeys::grow(a.generation), a.joiner.to_string());
        return true;
      },
      [&](const action::Admit& a) {
        set(ElasticKeys::admitted(a.node, a.round), a.join ? "join" : "initial");
        return true;
      },
      [&](const action::Note& a) {
        note_(a.text);
        return true;
      },
      [&](const action::RestartGroup& a) {
        // The other nodes follow; the supervisor starts node 0's workers again.
        set(ElasticKeys::round(), std::to_string(a.round));
        return false;
      },
      [](const action::RestartWorker&) { return false; },
      [](const action::End&) { return false; },
  };
  return std::visit(write, decided);
}

std::vector<ArbiterAction> ArbiterService::start_round(const std::vector<WorkerId>& ids,
                                                       int worker_port) {
  set(ElasticKeys::worker_port(arbiter_.round()), std::to_string(worker_port));
  return feed(event::NodeIn{0, ids});
}

// What the workers said of themselves: read before a loss is decided (whether the worker lost had
// left its training loop decides what its loss is), and every 100 ms (a node's silence is decided
// within a poll).
void ArbiterService::refresh() {
  refreshed_ = Clock::now();
  if (!arbiter_.speaks()) {
    for (const auto* list : {&arbiter_.members(), &arbiter_.joining()}) {
      for (const auto& id : *list) {
        if (has(ElasticKeys::speaks(id.to_string()))) {
          feed(event::Speaks{});
          break;
        }
      }
      if (arbiter_.speaks()) break;
    }
  }
  for (const auto& id : arbiter_.not_known_holders()) {
    if (has(ElasticKeys::holds(id.to_string()))) feed(event::Holds{id});
  }
  // One read a refresh, not one a member, until a worker says it left its training loop.
  if (const int64_t trained = add(ElasticKeys::trained_count(), 0); trained != trained_seen_) {
    trained_seen_ = trained;
    // Copied: a member out of its training loop leaves members().
    for (const auto& id : std::vector<WorkerId>(arbiter_.members())) {
      if (has(ElasticKeys::trained(id.to_string()))) feed(event::Trained{id});
    }
  }
  if (has(ElasticKeys::checkpoint())) {
    feed(event::Checkpoint{get(ElasticKeys::checkpoint())});
  }
}

std::vector<ArbiterAction> ArbiterService::lost(const std::vector<WorkerId>& ids,
                                                const std::string& what, int exit_code) {
  refresh();
  return feed(event::Lost{ids, what, exit_code});
}

std::vector<ArbiterAction> ArbiterService::done(const std::vector<WorkerId>& ids) {
  return feed(event::Done{ids});
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
    if (has(ElasticKeys::ready(id.to_string()))) keep(feed(event::Ready{id}));
  }
  if (arbiter_.phase() == Arbiter::Phase::kRunning &&
      has(ElasticKeys::reform(arbiter_.generation()))) {
    const int64_t askers = add(ElasticKeys::reform_count(arbiter_.generation()), 0);
    keep(feed(event::Reform{static_cast<int>(askers)}));
  }
  keep(feed(event::Tick{}));
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
    read_event(comm::parse_event(get(key)), out);
  }
}

void ArbiterService::read_event(const NodeEvent& n, std::vector<ArbiterAction>& out) {
  const ArbiterEvent e = arbiter_event(n);
  const bool lost = std::holds_alternative<event::Lost>(e);
  if (lost) refresh();
  const int64_t before = arbiter_.generation();
  for (auto& a : feed(e)) out.push_back(std::move(a));
  if (!lost) return;
  const bool published =
      arbiter_.phase() == Arbiter::Phase::kRunning && arbiter_.generation() != before;
  note_(fmt::format("elastic: node {}'s worker {} lost: {}{}", n.node, n.ids, n.what,
                    published ? "; " + arbiter_.describe_generation() : ""));
}

void ArbiterService::read_beats(std::vector<ArbiterAction>& out) {
  const auto now = Clock::now();
  const std::vector<int> nodes = arbiter_.other_nodes();
  if (nodes.empty() || now - beats_read_ < kBeatEvery) return;
  beats_read_ = now;
  for (int n : nodes) {
    for (auto& a : feed(event::Beat{n, add(ElasticKeys::beat(n), 0)})) out.push_back(std::move(a));
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
