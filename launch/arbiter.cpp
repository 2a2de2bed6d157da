#include "arbiter.h"

#include <fmt/format.h>

#include <algorithm>
#include <variant>

namespace ddp::launch {
namespace {

void remove(std::vector<WorkerId>& ids, const WorkerId& id) {
  ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
}

bool contains(const std::vector<WorkerId>& ids, const WorkerId& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

double seconds_of(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

bool first_generation_due(int nodes_in, int min_nodes, int max_nodes, Clock::duration waited,
                          Clock::duration last_call) {
  return nodes_in >= max_nodes || (nodes_in >= min_nodes && waited >= last_call);
}

Arbiter::Arbiter(Settings settings, Clock::time_point now)
    : settings_(settings), round_began_(now) {}

std::vector<ArbiterAction> Arbiter::on(const ArbiterEvent& event, Clock::time_point now) {
  Actions out;
  if (phase_ == Phase::kEnded) return out;
  std::visit([&](const auto& e) { handle(e, now, out); }, event);
  return out;
}

void Arbiter::handle(const event::Restarted& e, Clock::time_point, Actions&) {
  joining_.insert(joining_.end(), e.workers.begin(), e.workers.end());
}

void Arbiter::handle(const event::Lost& e, Clock::time_point now, Actions& out) {
  lose(e.workers, e.what, e.exit_code, now, out);
}

void Arbiter::handle(const event::Done& e, Clock::time_point, Actions& out) {
  for (const auto& id : e.workers) {
    leave_training(id);
    ended_ok_.insert(id);
  }
  end_if_finished(out);
}

void Arbiter::handle(const event::Trained& e, Clock::time_point, Actions&) {
  if (contains(members_, e.worker)) leave_training(e.worker);
}

void Arbiter::handle(const event::Holds& e, Clock::time_point, Actions&) {
  holders_.insert(e.worker);
}

void Arbiter::handle(const event::Speaks&, Clock::time_point, Actions&) {
  speaks_ = true;
}

void Arbiter::handle(const event::Checkpoint& e, Clock::time_point, Actions&) {
  checkpoint_ = e.which;
}

void Arbiter::handle(const event::Reform& e, Clock::time_point now, Actions&) {
  if (phase_ != Phase::kRunning) return;
  if (!reform_seen_) reform_seen_ = now;
  reform_askers_ = std::max(reform_askers_, e.askers);
}

// Note [A request every member made is granted at once]
// The members' request for the next generation waits reform_delay, for two words that may be late:
// a member whose death made the others ask is reaped and left out, and a joiner that asks says
// first whether it holds the state. Neither is missing when every member asked (the dead cannot
// ask) and each is known to hold the state: the members' requests after a grow, which waited
// 100 ms of each grow's stop for nothing.
bool Arbiter::reform_due(Clock::time_point now) const {
  if (!reform_seen_) return false;
  if (now - *reform_seen_ >= settings_.reform_delay) return true;
  return reform_askers_ >= static_cast<int>(members_.size()) &&
         std::all_of(members_.begin(), members_.end(),
                     [&](const WorkerId& id) { return holds_state(id); });
}

void Arbiter::handle(const event::Beat& e, Clock::time_point now, Actions& out) {
  const auto it = nodes_.find(e.node);
  if (it == nodes_.end() || it->second.beat == e.count) return;
  Node& node = it->second;
  if (!node.in) out.push_back(action::Note{fmt::format("elastic: node {} is back", e.node)});
  node = Node{true, e.count, now};
}

void Arbiter::handle(const event::Ready& e, Clock::time_point, Actions& out) {
  const WorkerId& id = e.worker;
  if (!contains(joining_, id) || contains(ready_, id)) return;
  ready_.push_back(id);
  if (phase_ != Phase::kRunning) return;  // the first generation takes it in
  out.push_back(action::Grow{generation_, id});
}

void Arbiter::handle(const event::Tick&, Clock::time_point now, Actions& out) {
  if (phase_ == Phase::kForming) return form(now, out);
  drop_silent_nodes(now, out);
  if (phase_ != Phase::kRunning) return;
  if (unowned_) return settle_unowned(now, out);  // its restarts wait for it
  restart_when_due(now, out);
  if (!reform_due(now)) return;
  // Asked by members that then left their loop (Note [Every ending is decided]): no generation
  // of joiners alone.
  if (!any_holder()) return;
  take_in_ready_joiners();
  publish(out);
  out.push_back(action::Note{"elastic: " + describe_generation()});
}

// The round's first generation, once its nodes are in (or the job's end, when MIN do not come).
void Arbiter::form(Clock::time_point now, Actions& out) {
  const int in = static_cast<int>(registered_.size());
  if (now - round_began_ > settings_.form_within && in < settings_.min_nodes) {
    std::vector<int> missing;
    for (const auto& entry : nodes_) {
      if (registered_.count(entry.first) == 0) missing.push_back(entry.first);
    }
    return end(1,
               fmt::format("{} node(s) registered their workers within {:.0f} s, fewer than the "
                           "{} of --nnodes {}:{}{}",
                           in, seconds_of(settings_.form_within), settings_.min_nodes,
                           settings_.min_nodes, settings_.max_nodes,
                           missing.empty()
                               ? ""
                               : fmt::format(" (waited for node(s) {})", fmt::join(missing, ", "))),
               out);
  }
  if (registered_.count(0) == 0 ||
      !first_generation_due(in, settings_.min_nodes, settings_.max_nodes, now - round_began_,
                            settings_.node_timeout)) {
    return;
  }
  phase_ = Phase::kRunning;
  holders_.insert(members_.begin(), members_.end());  // Note [Committed state has an owner]
  take_in_ready_joiners();
  publish(out);
  if (settings_.max_nodes > 1 || round_ > 0) {
    out.push_back(
        action::Note{fmt::format("elastic: {}generation {} of {} worker(s) on {} node(s): {}",
                                 round_ > 0 ? fmt::format("round {}: ", round_) : "", generation_,
                                 members_.size(), in, fmt::join(members_, ","))});
  }
}

// Each other node beats every 100 ms; one whose beat stood still for the node timeout is out of the
// job with its workers (below MIN nodes, the job ends), and back when its beats resume.
void Arbiter::drop_silent_nodes(Clock::time_point now, Actions& out) {
  for (auto& [n, node] : nodes_) {
    if (!node.in || now - node.heard <= settings_.node_timeout) continue;
    node.in = false;
    Ids ids;
    for (const auto* list : {&members_, &joining_}) {
      for (const auto& id : *list) {
        if (id.node == n) ids.push_back(id);
      }
    }
    // Its workers past their loop that had not ended: their launcher stops them, so they fail
    // in their ending (Note [Every ending is decided]).
    for (const auto& id : out_of_training_) {
      if (id.node == n && ended_ok_.count(id) == 0) ids.push_back(id);
    }
    const std::string what =
        fmt::format("node {}: not heard from for {:.1f} s (its link or its launcher is down)", n,
                    seconds_of(now - node.heard));
    if (const std::string why = below_min(); !why.empty()) {
      out.push_back(action::Note{"elastic: " + what});
      return end(1, why, out);
    }
    const int64_t before = generation_;
    lose(ids, what, 1, now, out);
    if (phase_ != Phase::kRunning) return;
    out.push_back(action::Note{fmt::format(
        "elastic: {}{}", what, generation_ == before ? "" : "; " + describe_generation())});
  }
}

std::string Arbiter::describe_generation() const {
  return fmt::format("generation {} of {} worker(s): {}", generation_, members_.size(),
                     fmt::join(members_, ","));
}

void Arbiter::handle(const event::NodeIn& e, Clock::time_point now, Actions& out) {
  if (e.node != 0) nodes_[e.node] = Node{true, -1, now};
  const bool join = phase_ == Phase::kRunning;
  Ids& to = join ? joining_ : members_;
  to.insert(to.end(), e.workers.begin(), e.workers.end());
  if (!join) registered_.insert(e.node);
  if (e.node == 0) return;  // node 0's workers are started by its own launcher
  out.push_back(action::Admit{e.node, round_, join});
  out.push_back(action::Note{fmt::format("elastic: node {} is in the job with worker(s) {}{}",
                                         e.node, fmt::join(e.workers, ","),
                                         join ? ", which join the running group" : "")});
}

// Out of the group at once: one generation without all of `ids` (Note [Committed state has an
// owner] says when there is none, Note [Every ending is decided] what a loss after training is).
void Arbiter::lose(const Ids& ids, const std::string& what, int exit_code, Clock::time_point now,
                   Actions& out) {
  std::vector<int> ranks;
  bool after_training = false;
  for (const auto& id : ids) {
    remove(joining_, id);
    remove(ready_, id);
    after_training = after_training || out_of_training_.count(id) != 0;
    if (contains(members_, id) || out_of_training_.count(id) != 0) ranks.push_back(rank_of(id));
  }
  if (ranks.empty()) return restart_later(ids, now);  // joiners, not yet members
  for (const auto& id : ids) remove(members_, id);
  if (phase_ == Phase::kForming) {
    return restart_group(fmt::format("{} before the first generation formed", what), exit_code, now,
                         out);
  }
  // "rank 1 of generation 0, worker 1.0 (local rank 1, pid 42, host h): signal SIGKILL (9)"
  const std::string who =
      fmt::format("{} {} of generation {}, {}", ranks.size() == 1 ? "rank" : "ranks",
                  fmt::join(ranks, ","), generation_, what);
  if (!speaks_) {  // torchrun's agent: the whole group again
    return restart_group(
        fmt::format("{} (the program does not take part in elastic membership)", who), exit_code,
        now, out);
  }
  if (after_training) {  // the job cannot go on, restarts or not
    return end(std::max(1, exit_code),
               fmt::format("{}, after it left its training loop: the group's training is over, "
                           "and no generation can take the loss in: the job failed",
                           who),
               out);
  }
  lose_members(ids, who, what, exit_code, now, out);
}

// Members lost while training: the generation is given up (`notice`), the survivors' published
// while one of them holds the state, and the lost workers restarted when the loss window closes.
void Arbiter::lose_members(const Ids& ids, const std::string& notice_text, const std::string& what,
                           int exit_code, Clock::time_point now, Actions& out) {
  out.push_back(action::AbortNotice{generation_, notice_text});
  restart_later(ids, now);
  if (any_holder()) {
    // A ready joiner is taken into this generation: waiting for the next grow would strand it.
    take_in_ready_joiners();
    return publish(out);
  }
  const std::string lost =
      fmt::format("no worker holding the group's trained state is left (lost: {})", what);
  if (members_.empty()) return back_to_checkpoint(lost, exit_code, now, out);
  // Members still taking the state: their word decides (Note [A joiner's word on the state]).
  if (!unowned_) unowned_ = Unowned{lost, exit_code, now};
}

// Note [A joiner's word on the state]: a member holds the state after all (it said so), or
// the members asked for the next generation without saying so, or the node timeout passed.
void Arbiter::settle_unowned(Clock::time_point now, Actions& out) {
  if (any_holder()) {
    Ids holders;
    for (const auto& id : members_) {
      if (holds_state(id)) holders.push_back(id);
    }
    unowned_.reset();
    take_in_ready_joiners();
    publish(out);
    out.push_back(
        action::Note{fmt::format("elastic: worker(s) {} hold the group's trained state: {}",
                                 fmt::join(holders, ","), describe_generation())});
    return;
  }
  const bool asked = reform_due(now);
  if (!asked && now - unowned_->since < settings_.node_timeout) return;
  const Unowned u = *unowned_;
  unowned_.reset();
  back_to_checkpoint(asked ? u.lost
                           : fmt::format("{}; generation {}'s members did not say they hold it "
                                         "within {:.0f} s",
                                         u.lost, generation_, seconds_of(settings_.node_timeout)),
                     u.exit_code, now, out);
}

// Nothing of the group's progress is left in a worker that trains: every worker starts again from
// the newest checkpoint, or the job ends (`lost` says why).
void Arbiter::back_to_checkpoint(const std::string& lost, int exit_code, Clock::time_point now,
                                 Actions& out) {
  if (restarts_ >= settings_.max_restarts) return restart_group(lost, exit_code, now, out);  // ends
  if (checkpoint_.empty()) {
    return end(std::max(1, exit_code),
               lost +
                   "; the group wrote no checkpoint to go back to (ddp_train --save-every N "
                   "writes one every N epochs)",
               out);
  }
  restart_group(fmt::format("{}; going back to the newest checkpoint, {}", lost, checkpoint_),
                exit_code, now, out);
}

// Node 0's lost workers, restarted to join once the loss window closes (Note [Losses close
// together are one decision]).
void Arbiter::restart_later(const Ids& ids, Clock::time_point now) {
  if (phase_ != Phase::kRunning || !speaks_) return;
  for (const auto& id : ids) {
    if (id.node != 0) continue;  // another node restarts its own
    if (to_restart_.empty()) first_loss_ = now;
    to_restart_.push_back(id);
  }
}

void Arbiter::restart_when_due(Clock::time_point now, Actions& out) {
  if (to_restart_.empty() || now - first_loss_ < settings_.loss_window) return;
  Ids lost;
  lost.swap(to_restart_);
  for (const auto& id : lost) {
    if (restarts_ >= settings_.max_restarts) break;
    ++restarts_;
    joining_.push_back(id.next_incarnation());
    out.push_back(action::RestartWorker{joining_.back()});
  }
}

void Arbiter::restart_group(const std::string& why, int exit_code, Clock::time_point now,
                            Actions& out) {
  if (restarts_ >= settings_.max_restarts) {
    return end(std::max(1, exit_code),
               fmt::format("{}; no restart left (--max-restarts {})", why, settings_.max_restarts),
               out);
  }
  ++restarts_;
  if (generation_ >= 0) {  // members still waiting on it (another node's) give it up at once
    out.push_back(action::AbortNotice{generation_, "the job starts every worker again: " + why});
  }
  ++round_;
  phase_ = Phase::kForming;
  round_began_ = now;
  registered_.clear();
  members_.clear();
  published_.clear();
  joining_.clear();
  ready_.clear();
  out_of_training_.clear();
  ended_ok_.clear();
  holders_.clear();
  to_restart_.clear();
  unowned_.reset();
  reform_seen_.reset();
  reform_askers_ = 0;
  out.push_back(action::RestartGroup{round_, why});
  out.push_back(
      action::Note{fmt::format("elastic: {}; every worker starts again (restart {} of {})", why,
                               restarts_, settings_.max_restarts)});
}

void Arbiter::end(int exit_code, const std::string& why, Actions& out) {
  phase_ = Phase::kEnded;
  to_restart_.clear();
  unowned_.reset();
  out.push_back(action::End{exit_code, why, exit_code == 0 ? published_ : Ids()});
}

// Out of the membership for good (Note [Every ending is decided]).
void Arbiter::leave_training(const WorkerId& id) {
  remove(members_, id);
  remove(joining_, id);
  remove(ready_, id);
  out_of_training_.insert(id);
}

void Arbiter::end_if_finished(Actions& out) {
  if (finished()) end(0, "every member finished", out);
}

void Arbiter::publish(Actions& out) {
  ++generation_;
  reform_seen_.reset();
  reform_askers_ = 0;
  published_ = members_;
  out.push_back(action::Publish{generation_, members_});
}

void Arbiter::take_in_ready_joiners() {
  for (const auto& id : ready_) {
    members_.push_back(id);
    remove(joining_, id);
  }
  ready_.clear();
}

bool Arbiter::any_holder() const {
  return std::any_of(members_.begin(), members_.end(),
                     [&](const WorkerId& id) { return holds_state(id); });
}

std::vector<WorkerId> Arbiter::not_known_holders() const {
  Ids out;
  for (const auto* list : {&members_, &joining_}) {
    for (const auto& id : *list) {
      if (!holds_state(id)) out.push_back(id);
    }
  }
  return out;
}

std::vector<int> Arbiter::other_nodes() const {
  std::vector<int> out;
  for (const auto& entry : nodes_) out.push_back(entry.first);
  return out;
}

bool Arbiter::node_in(int node) const {
  const auto it = nodes_.find(node);
  return node == 0 || (it != nodes_.end() && it->second.in);
}

int Arbiter::nodes_in() const {
  return 1 + static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(),
                                            [](const auto& n) { return n.second.in; }));
}

std::string Arbiter::below_min() const {
  const int in = nodes_in();
  if (phase_ != Phase::kRunning || in >= settings_.min_nodes) return "";
  return fmt::format("{} node(s) left in the job, fewer than the {} of --nnodes {}:{}", in,
                     settings_.min_nodes, settings_.min_nodes, settings_.max_nodes);
}

// Note [Every ending is decided]: no member still trains, and every worker of the last
// generation ended 0.
bool Arbiter::finished() const {
  return phase_ == Phase::kRunning && members_.empty() && !published_.empty() &&
         std::all_of(published_.begin(), published_.end(),
                     [&](const WorkerId& id) { return ended_ok_.count(id) != 0; });
}

int Arbiter::rank_of(const WorkerId& id) const {
  const auto it = std::find(published_.begin(), published_.end(), id);
  return it == published_.end() ? -1 : static_cast<int>(it - published_.begin());
}

}  // namespace ddp::launch
