#include "ddp/train/elastic_member.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <utility>

#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"
#include "ddp/common/files.h"
#include "ddp/common/log.h"
#include "ddp/train/pt_file.h"
#include "phase.h"

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_after(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The heal's message: the state as a checkpoint (a .pt file's bytes), then the source's last
// lines of samples.jsonl, one per line. The length of the first comes first (8 bytes).
std::string heal_message(const Checkpoint& state,
                         const std::deque<std::pair<int64_t, std::string>>& lines) {
  const std::string pt = serialize_pt(to_ivalue(state));
  const uint64_t size = pt.size();
  std::string out(reinterpret_cast<const char*>(&size), sizeof size);
  out += pt;
  for (const auto& [step, line] : lines) out += line + '\n';
  return out;
}

// The watchdog of this rank's group: the stall warning after `stall_warning` seconds, and the
// flight record to <output>/debug/rank<r>.json and to the launcher's DDP_FLIGHT_DIR.
std::unique_ptr<comm::Watchdog> start_watchdog(const Distributed& dist, double stall_warning,
                                               const std::string& output_dir) {
  comm::WatchdogOptions options;
  options.stall_warning = std::chrono::milliseconds(static_cast<int64_t>(stall_warning * 1000.0));
  const std::string file = fmt::format("rank{}.json", dist.rank());
  options.dump_path = (std::filesystem::path(output_dir) / "debug" / file).string();
  const comm::Env env = comm::current_env();
  if (auto dir = env.find("DDP_FLIGHT_DIR"); dir != env.end() && !dir->second.empty()) {
    options.launcher_copy = (std::filesystem::path(dir->second) / file).string();
  }
  return std::make_unique<comm::Watchdog>(dist.group, options);
}

}  // namespace

// Thrown out of a step (or the epoch's end) when this member leaves its generation: `failed`
// when something failed (then the generation is given up by every member), not when it grows.
struct ElasticMember::Change {
  std::string why;
  bool failed = true;
  Clock::time_point seen = Clock::now();
};

ElasticMember::ElasticMember(Distributed& dist, TrainState& state, Timeline* timeline,
                             Options options)
    : dist_(dist),
      state_(state),
      timeline_(timeline),
      options_(std::move(options)),
      watchdog_(start_watchdog(dist_, options_.stall_warning, options_.output_dir)) {
  // The first generation of a round holds the group's state from the start: they begin alike,
  // or from the same checkpoint (Note [Committed state has an owner]). A joiner holds none yet.
  holds_state_ = enabled() && !dist_.joining;
}

bool ElasticMember::attempt(const std::function<void()>& part) {
  if (!enabled()) {
    part();
    return true;
  }
  try {
    part();
    return true;
  } catch (const Change& change) {
    reform(change);
  } catch (const comm::CommError& e) {
    // A collective between steps (a check, the epoch's metrics, evaluation or checkpoint) failed;
    // every step up to the last counted was committed by all members.
    reform({fmt::format("a collective after step {} failed ({})", state_.step(), e.what())});
  }
  return false;
}

void ElasticMember::join() {
  if (!enabled() || !dist_.joining || holds_state_) return;
  try {
    heal();
  } catch (const comm::CommError& e) {
    reform(
        {fmt::format("the group failed while worker {} joined ({})", dist_.agent->id(), e.what())});
  }
}

void ElasticMember::commit(const std::function<void()>& reduce) {
  if (!enabled()) return reduce();
  try {
    reduce();
  } catch (const comm::CommError& e) {
    log::warn("elastic: step {} failed: {}", state_.step() + 1, e.what());
    dist_.agent->abandon_vote();
    dist_.agent->vote(dist_.membership, ++vote_round_, false);  // "abort", for every member
    leave(fmt::format("step {} dropped", state_.step() + 1), true);
  }
  // Note [A step's vote travels during the next step]: the last step's decision, then this
  // step's vote, which the next step's computation hides.
  settle();
  dist_.agent->vote_in_background(dist_.membership, ++vote_round_);
}

void ElasticMember::reached(EpochPosition at, std::string samples_line) {
  if (!enabled()) return;
  position_ = std::move(at);
  if (!samples_line.empty()) {
    recent_samples_.emplace_back(state_.step(), std::move(samples_line));
    if (recent_samples_.size() > 3) recent_samples_.pop_front();
  }
  // Not after an epoch's last step (the next generation would enter an epoch with nothing left
  // to train): the next epoch's first step grows.
  if (grow_due_ && position_->epoch_step < position_->epoch_steps) {
    grow_due_ = false;
    leave("a worker joins", false);
  }
}

void ElasticMember::settle() {
  if (!enabled()) return;
  std::optional<comm::StepDecision> decision;
  try {
    decision = dist_.agent->take_vote();
  } catch (const comm::CommError& e) {
    leave(fmt::format("the vote on step {} failed ({})", state_.step(), e.what()), true);
  }
  if (!decision) return;  // none in flight
  if (*decision == comm::StepDecision::kAbort) {
    leave(fmt::format("a member failed after step {}", state_.step()), false);
  }
  if (*decision == comm::StepDecision::kCommitAndGrow && !grow_due_) {
    grow_due_ = true;
    // The flight recorder's label until the next step's: the group re-forms after this step.
    const Phase phase(*dist_.group, fmt::format("elastic: generation {}: a worker joins",
                                                dist_.membership.generation));
  }
  if (recovering_) {
    auto& [record, seen] = *recovering_;
    record.recovery_seconds = seconds_after(seen);
    log::info(
        "elastic: step {} committed by generation {} of {} rank(s), {:.3f} s after the "
        "change was seen",
        state_.step(), record.generation, record.world_after, record.recovery_seconds);
    records_.push_back(std::move(record));
    recovering_.reset();
  }
}

void ElasticMember::checkpoint_saved(const std::string& which) {
  if (enabled() && dist_.is_main()) dist_.agent->announce_checkpoint(which);
}

void ElasticMember::done_training() {
  if (enabled()) dist_.agent->announce_trained();
}

std::vector<MembershipRecord> ElasticMember::take_records() {
  return std::exchange(records_, {});
}

std::string ElasticMember::dump_flight_record(const std::string& reason) {
  return watchdog_ ? watchdog_->dump_flight_record(reason) : "";
}

void ElasticMember::leave(std::string why, bool failed) {
  throw Change{std::move(why), failed};
}

void ElasticMember::reform(const Change& change) {
  const auto start = Clock::now();
  dist_.agent->abandon_vote();  // the last step's: no member of this generation waits for it now
  // A member that failed says so at once: the others' collectives with it end now (an nccl
  // communicator is aborted on this notice), not at their timeout.
  if (change.failed) dist_.agent->report_failure(dist_.membership, change.why);
  grow_due_ = false;
  const int64_t generation = dist_.membership.generation;
  const int64_t world = dist_.world_size();
  const Timeline::Scope span(timeline_, "elastic: re-forming the group", "elastic", state_.step());
  until_a_generation_forms(dist_, [this] { form_next_generation(); });
  const std::string lost = dist_.agent->lost_in(generation);
  const EpochPosition now = state_.position();  // the healed state's
  log::warn(
      "elastic: worker {} (pid {}): {} in generation {} of {} rank(s){}; generation {}: {} "
      "rank(s) ({}), batch {} per rank, going on after step {} ({} of epoch {}), {:.2f} s after",
      dist_.agent->id(), ::getpid(), change.why, generation, world,
      lost.empty() ? "" : " (lost: " + lost + ")", dist_.membership.generation, dist_.world_size(),
      comm::format_members(dist_.membership.members), state_.batch_size(), state_.step(),
      now.epoch_step, now.epoch + 1, seconds_after(start));
  // Timed from when the change was seen to the first step committed after it (settle()).
  recovering_.emplace(MembershipRecord{state_.step(), change.why, lost, dist_.membership.generation,
                                       world, dist_.world_size(), 0.0},
                      change.seen);
}

void ElasticMember::form_next_generation() {
  dist_.agent->request_next_generation(dist_.membership);
  // The old generation's group goes with the last use of it: the watchdog's, the state's.
  watchdog_.reset();
  state_.release_group();
  {
    const Timeline::Scope span(timeline_, "elastic: connecting the group", "elastic",
                               state_.step());
    join_next_generation(dist_);
  }
  log::init(dist_.rank(), options_.log_level);  // rank 0 may be another worker now
  vote_round_ = 0;
  watchdog_ = start_watchdog(dist_, options_.stall_warning, options_.output_dir);
  state_.adopt_group();
  heal();
}

// Note [One state transfer per change].
int ElasticMember::state_source() {
  const Phase phase(*dist_.group, fmt::format("elastic: generation {}: state holders",
                                              dist_.membership.generation));
  const at::Tensor all = comm::all_gather_rows(
      *dist_.group, torch::tensor({holds_state_ ? int64_t{1} : 0, state_.step()}), dist_.device);
  int source = -1;
  for (int r = 0; r < dist_.world_size(); ++r) {
    if (all[r][0].item<int64_t>() == 0) continue;
    if (source < 0 || all[r][1].item<int64_t>() > all[source][1].item<int64_t>()) source = r;
  }
  if (source < 0) {  // the launcher publishes no such generation (Note [Committed state ...])
    throw Error(
        fmt::format("elastic: no member of generation {} ({}) holds the group's trained state",
                    dist_.membership.generation, comm::format_members(dist_.membership.members)));
  }
  return source;
}

void ElasticMember::heal() {
  const int64_t g = dist_.membership.generation;
  std::optional<Timeline::Scope> span;
  span.emplace(timeline_, "elastic: the state's transfer", "elastic", state_.step());
  const int source = state_source();
  const std::string from =
      fmt::format("rank {} (worker {})", source, dist_.membership.members.at(source));
  std::string bytes;
  {
    const Phase phase(*dist_.group, fmt::format("elastic: generation {}: state", g));
    // The source's state at its last counted step, as a checkpoint resumed on this generation's
    // world would have it.
    if (dist_.rank() == source)
      bytes = heal_message(
          state_.to_send(position_ ? *position_ : state_.position(), dist_.world_size()),
          recent_samples_);
    bytes = comm::broadcast_bytes(*dist_.group, bytes, source, dist_.device);
  }
  span.emplace(timeline_, "elastic: taking the state", "elastic", state_.step());
  uint64_t size = 0;
  std::memcpy(&size, bytes.data(), sizeof size);
  const std::string origin = "elastic: the state of " + from;
  state_.take(
      checkpoint_from(parse_pt(std::string_view(bytes).substr(sizeof size, size), origin), origin),
      origin);
  position_.reset();  // the state's own (state_.position())
  recent_samples_.clear();
  std::istringstream lines(bytes.substr(sizeof size + size));
  for (std::string line; std::getline(lines, line);) {
    recent_samples_.emplace_back(nlohmann::json::parse(line).at("step").get<int64_t>(), line);
  }
  complete_samples_record();
  span.emplace(timeline_, "elastic: the state's check", "elastic", state_.step());
  check_state(source, from);
  if (!holds_state_) dist_.agent->announce_holds();
  holds_state_ = true;
}

void ElasticMember::check_state(int source, const std::string& from) {
  // Every member now holds the source's parameters, buffers, optimizer and GradScaler state, RNG
  // state and step, bitwise: checked before the generation's first step.
  const int64_t g = dist_.membership.generation;
  const Phase phase(*dist_.group, fmt::format("elastic: generation {}: state check", g));
  const auto digest = static_cast<int64_t>(state_.digest());
  const std::vector<int64_t> differ = comm::ranks_differing(
      comm::all_gather_rows(*dist_.group, torch::tensor({digest}), dist_.device), source);
  if (!differ.empty()) {
    throw Error(fmt::format(
        "elastic: rank(s) {} of generation {} do not hold the state of {} after taking it "
        "(parameters, buffers, optimizer, GradScaler or RNG state differ)",
        fmt::join(differ, ", "), g, from));
  }
  log::info(
      "elastic: the {} rank(s) hold bitwise the same state before step {} (digest {:016x}), "
      "taken from {}",
      dist_.world_size(), state_.step() + 1, static_cast<uint64_t>(digest), from);
}

void ElasticMember::complete_samples_record() {
  if (!options_.record_samples || !dist_.is_main()) return;
  // samples.jsonl holds steps 1 to the state's step, each once: a lost rank 0 may have written
  // lines of steps the group did not keep (a step it applied alone), or fewer than the source
  // applied; the source's last lines fill in.
  const std::string path = (std::filesystem::path(options_.output_dir) / "samples.jsonl").string();
  const int64_t steps = state_.step();
  const int64_t before_recent =
      recent_samples_.empty() ? steps : std::min(steps, recent_samples_.front().first - 1);
  std::string kept = std::filesystem::exists(path)
                         ? records_up_to(read_file(path), "step", before_recent)
                         : std::string();
  for (const auto& [step, line] : recent_samples_) {
    if (step <= steps) kept += line + '\n';
  }
  write_file_atomically(path, kept);
}

}  // namespace ddp::train
