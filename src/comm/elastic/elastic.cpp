#include "ddp/comm/elastic/elastic.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "backends/backends.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "job_thread.h"
#include "store/store_client.h"

namespace ddp::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string text_of(const std::vector<uint8_t>& bytes) {
  return {bytes.begin(), bytes.end()};
}
std::vector<uint8_t> bytes_of(const std::string& text) {
  return {text.begin(), text.end()};
}

// How often a member waiting for a decision looks for the launcher's abort notice: the wait for
// the last vote is short (the votes follow an all-reduce that every member left together), so
// this is paid only when a member died.
constexpr auto kAbortPoll = std::chrono::milliseconds(20);

}  // namespace

ElasticAgent::ElasticAgent(const LaunchInfo& launch, std::string id, ElasticAgentOptions options)
    : launch_(launch),
      id_(std::move(id)),
      options_(std::move(options)),
      store_(c10::make_intrusive<StoreClient>(options_.store_host, options_.store_port,
                                              options_.token, options_.timeout)),
      voter_(std::make_unique<JobThread>()) {
  store_->set(ElasticKeys::speaks(id_), bytes_of("1"));
}

ElasticAgent::~ElasticAgent() {
  try {
    abandon_vote();
  } catch (const std::exception&) {
    // The store is gone with the launcher: nobody waits for this vote any more.
  }
}

Membership ElasticAgent::next_membership(int64_t after) {
  auto deadline = Clock::now() + options_.timeout;
  // From the newest published: a member late to re-form (it was busy, or failing as the others
  // moved on) passes over the generations given up meanwhile.
  int64_t g = after + 1;
  if (store_->check({ElasticKeys::latest()})) {
    g = std::max<int64_t>(g, std::stoll(text_of(store_->get(ElasticKeys::latest()))));
  }
  while (true) {
    const std::string key = ElasticKeys::generation(g);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      store_->wait({key}, std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
      if (grow_due()) {  // Note [A joiner's place is kept while its grow is due]
        deadline = Clock::now() + options_.timeout;
        continue;
      }
      // Not a CommError: no later generation can be had either.
      throw Error(fmt::format(
          "worker {}: the launcher ({}:{}) published no generation after {} that includes it "
          "within {} ms",
          id_, options_.store_host, options_.store_port, after, options_.timeout.count()));
    }
    Membership m;
    m.generation = g;
    m.members = parse_members(text_of(store_->get(key)));
    const auto it = std::find(m.members.begin(), m.members.end(), id_);
    if (it != m.members.end() && !store_->check({ElasticKeys::abort(g)})) {
      m.rank = static_cast<int>(it - m.members.begin());
      return m;
    }
    ++g;  // not in this one (a joiner not ready when it formed), or given up already: the next
  }
}

// Note [A joiner's place is kept while its grow is due]
// A joiner that announced it is ready gets the launcher's grow on the newest generation at once;
// the members take it in after their next step, or, when the epoch has no step left, after the
// next epoch's first one: past the epoch's end (evaluation, checkpoint), which may take longer
// than --rendezvous-timeout. So a joiner's wait runs on as long as that grow is due (the newest
// generation grows and is not given up): its end is the members' doing, each of them waiting with
// deadlines of its own (a collective's, a vote's); a generation given up is followed at once by
// one that takes the ready joiner in, and the job's end stops it. It timed out instead, ended 1
// and cost a restart.
bool ElasticAgent::grow_due() {
  if (!ready_ || !store_->check({ElasticKeys::latest()})) return false;
  const int64_t g = std::stoll(text_of(store_->get(ElasticKeys::latest())));
  const bool due = store_->check({ElasticKeys::grow(g)}) && !store_->check({ElasticKeys::abort(g)});
  if (due && !told_grow_due_) {
    told_grow_due_ = true;
    log::warn(  // a joiner is not rank 0: a warning, to be seen
        "elastic: worker {}: generation {} takes it in after the members' next step, past "
        "--rendezvous-timeout ({} ms): waiting on",
        id_, g, options_.timeout.count());
  }
  return due;
}

std::unique_ptr<ProcessGroup> ElasticAgent::make_group(const Membership& m,
                                                       const ProcessGroupOptions& options,
                                                       const std::string& backend) {
  // A connection of the group's own, whose waits end when the launcher aborts the generation: a
  // member that dies while the others connect to it (or take the state from it) leaves no one
  // waiting for the rendezvous timeout.
  auto store = c10::make_intrusive<StoreClient>(options_.store_host, options_.store_port,
                                                options_.token, options_.timeout);
  store->abort_waits_when_set(ElasticKeys::abort(m.generation));
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
      ElasticKeys::generation(m.generation) + "/group", store);
  LaunchInfo launch = launch_;
  launch.rank = m.rank;
  launch.world_size = m.world_size();
#ifdef DDP_HAVE_NCCL
  if (backend == "nccl") {
    // NCCL learns of a dead member from nobody (its collectives would wait for the timeout): the
    // group aborts its communicator on the launcher's notice, asked on this connection.
    const std::string notice = ElasticKeys::abort(m.generation);
    return make_nccl_process_group(launch, options,
                                   store_broadcast_bytes(prefixed, m.rank, "nccl_unique_id"),
                                   [store, notice] { return store->check({notice}); });
  }
#endif
#ifdef DDP_HAVE_GLOO
  if (backend == "gloo" || backend == "shm") {
    return unless_given_up(m, [prefixed, launch, options, backend]() {
      auto gloo = make_gloo_process_group_on(prefixed, launch, options);
      return backend == "shm" ? make_shm_process_group(std::move(gloo), options) : std::move(gloo);
    });
  }
#endif
  (void)options;
  throw InputError("elastic training needs the gloo or nccl backend; this build lacks " + backend);
}

// Note [A generation's connection is left behind when it is given up]
// gloo connects the pairs of a group with no way to stop it: where a member died after it had
// published its address, the member that waits for it to connect waits in gloo for the whole
// timeout (--comm-timeout, 600 s by default), while the others, and the replacement, wait for that
// member in the next generation. The launcher gives the generation up at once; this is where the
// member hears it. The group is made on a thread of its own, and this one waits for it, looking
// for the launcher's abort notice every 20 ms; once the notice is there, it throws CommError (the
// generation failed as it formed, as a failed connection would have said) and leaves the thread,
// which holds all it made (the generation's gloo device and store connection), to end at gloo's
// timeout. Found by a storm of kills: a member killed just as a joiner was taken in left the two
// others in gloo's connect, a generation apart, and the job stopped.
std::unique_ptr<ProcessGroup> ElasticAgent::unless_given_up(const Membership& m, GroupMaker make) {
  using Task = std::packaged_task<std::unique_ptr<ProcessGroup>()>;
  auto task = std::make_shared<Task>(std::move(make));
  auto made = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  const std::string notice = ElasticKeys::abort(m.generation);
  while (made.wait_for(kAbortPoll) != std::future_status::ready) {
    if (!store_->check({notice})) continue;
    throw CommError(
        forming_info("connecting generation " + std::to_string(m.generation), m.rank,
                     m.world_size()),
        fmt::format("rank {}: the launcher gave generation {} up as its group connected", m.rank,
                    m.generation));
  }
  return made.get();  // the group, or the failure of its connection
}

StepDecision ElasticAgent::vote(const Membership& m, int64_t round, bool ok) {
  const std::string decision = ElasticKeys::decision(m.generation, round);
  auto decide = [&](StepDecision d) {
    return parse_decision(text_of(store_->compareSet(decision, {}, bytes_of(to_string(d)))));
  };
  if (!ok) return decide(StepDecision::kAbort);
  // One counter for all rounds: every member votes once a round, so round r is complete at
  // r x members (a member that fails writes "abort" instead, and the generation ends).
  if (store_->add(ElasticKeys::votes(m.generation), 1) == round * m.world_size()) {
    const bool grow = store_->check({ElasticKeys::grow(m.generation)});
    const StepDecision d = decide(grow ? StepDecision::kCommitAndGrow : StepDecision::kCommit);
    // Every member voted in this round, so every member has read the last round's decision: its
    // key goes (the store would otherwise grow by one key a step for as long as the job runs).
    if (round > 1) store_->deleteKey(ElasticKeys::decision(m.generation, round - 1));
    return d;
  }
  // The last vote follows at once (the votes follow an all-reduce that every member left
  // together): one get that waits. While the decision is late, this member says it voted
  // (elastic/gen/<g>/voted/<rank>: so a wait that times out can name the members that did not)
  // and looks for the launcher's abort notice; the wait ends at the vote timeout.
  const auto deadline = Clock::now() + options_.vote_timeout;
  for (bool said = false;; said = true) {
    if (const auto d = static_cast<StoreClient&>(*store_).get_within(decision, kAbortPoll)) {
      return parse_decision(text_of(*d));
    }
    if (!said) {
      store_->set(ElasticKeys::voted(m.generation, m.rank), bytes_of(std::to_string(round)));
    }
    if (store_->check({ElasticKeys::abort(m.generation)})) return decide(StepDecision::kAbort);
    if (Clock::now() < deadline) continue;
    const std::string why = fmt::format(
        "no decision on vote {} of generation {} within {} ms: waited for the vote(s) of {}", round,
        m.generation, options_.vote_timeout.count(), missing_votes(m, round));
    log::warn("elastic: worker {}: {}", id_, why);
    report_failure(m, why);
    return decide(StepDecision::kAbort);
  }
}

std::string ElasticAgent::missing_votes(const Membership& m, int64_t round) {
  std::vector<std::string> missing;
  for (int r = 0; r < m.world_size(); ++r) {
    const std::string key = ElasticKeys::voted(m.generation, r);
    const bool voted = store_->check({key}) && std::stoll(text_of(store_->get(key))) >= round;
    if (!voted) missing.push_back(fmt::format("rank {} (worker {})", r, m.members[r]));
  }
  return missing.empty() ? "none (all voted; the decision is lost)"
                         : fmt::format("{}", fmt::join(missing, ", "));
}

void ElasticAgent::vote_in_background(const Membership& m, int64_t round) {
  background_generation_ = m.generation;
  background_round_ = round;
  background_ = voter_->post([this, m, round] { background_decision_ = vote(m, round, true); });
}

std::optional<StepDecision> ElasticAgent::take_vote() {
  if (!background_.valid()) return std::nullopt;
  std::exchange(background_, {}).get();  // rethrows the vote's error (the store lost)
  return background_decision_;
}

void ElasticAgent::abandon_vote() {
  if (!background_.valid()) return;
  const std::string decision = ElasticKeys::decision(background_generation_, background_round_);
  try {
    store_->compareSet(decision, {}, bytes_of(to_string(StepDecision::kAbort)));
  } catch (const std::exception&) {
    // Decided or not, the vote below ends: its own store calls fail the same way.
  }
  std::exchange(background_, {}).wait();
}

std::string ElasticAgent::lost_in(int64_t g) {
  const std::string key = ElasticKeys::abort(g);
  return store_->check({key}) ? text_of(store_->get(key)) : std::string();
}

void ElasticAgent::report_failure(const Membership& m, const std::string& why) {
  const std::string notice =
      fmt::format("rank {} of generation {}, worker {}: {}", m.rank, m.generation, id_, why);
  store_->compareSet(ElasticKeys::abort(m.generation), {}, bytes_of(notice));
}

void ElasticAgent::request_next_generation(const Membership& m) {
  store_->add(ElasticKeys::reform_count(m.generation), 1);  // first: the launcher reads it after
  store_->set(ElasticKeys::reform(m.generation), bytes_of(id_));
}

void ElasticAgent::announce_ready() {
  store_->set(ElasticKeys::ready(id_), bytes_of("1"));
  ready_ = true;
}

void ElasticAgent::announce_holds() {
  store_->set(ElasticKeys::holds(id_), bytes_of("1"));
}

void ElasticAgent::announce_trained() {
  store_->set(ElasticKeys::trained(id_), bytes_of("1"));
  store_->add(ElasticKeys::trained_count(), 1);  // after: the launcher finds the key it counts
}

void ElasticAgent::announce_checkpoint(const std::string& which) {
  store_->set(ElasticKeys::checkpoint(), bytes_of(which));
}

}  // namespace ddp::comm
