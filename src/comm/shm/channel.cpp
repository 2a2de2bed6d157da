#include "ddp/comm/shm/channel.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ddp::comm::shm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kLine = 64;     // a cache line: the control blocks do not share one
constexpr size_t kPage = 4096;   // the buffers start on a page, slots are whole pages
constexpr size_t kMaxSlot = size_t{4} << 20;
// Polls before a waiter sleeps: about 20-100 us, longer than most rounds of small tensors take
// to line up, short enough not to steal much of a core that a rank's computation needs.
constexpr int kSpins = 2000;
// A sleeper wakes at least this often, to look at the clock and at the ranks it waits for.
constexpr long kSleepNs = 2'000'000;
// A sleeper looks at the lives of the ranks it waits for this often: a dead rank is seen within
// 10 ms, as gloo sees a reset connection (an elastic job's survivors stop no longer than that
// before they re-form), and a look costs a trylock in user space on each rank still missing.
constexpr auto kLivenessEvery = std::chrono::milliseconds(10);
// Up to this many bytes a round, every rank combines the whole chunk itself (one barrier); above
// it, with more than 2 ranks, each combines a slice and copies the others' (two barriers, a
// world-th of the reading).
constexpr size_t kWholeChunkBytes = 64 << 10;

size_t align_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Process-shared futex calls (no FUTEX_PRIVATE_FLAG: the word is in memory of several processes).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  const timespec sleep{0, kSleepNs};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &sleep, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// "rank 2", "ranks 0 and 2", "ranks 0, 1 and 3".
std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {}", ranks.front());
  const std::vector<int> head(ranks.begin(), ranks.end() - 1);
  return fmt::format("ranks {} and {}", fmt::join(head, ", "), ranks.back());
}

}  // namespace

// Shared: every field is read and written by several processes, only through atomics (a zeroed
// region is every atomic at 0: they are lock-free, so plain memory).
struct alignas(kLine) Channel::Header {
  std::atomic<uint32_t> bell;       // the futex word: bumped by every publication
  std::atomic<uint32_t> sleepers;   // waiters in futex_wait: a publisher wakes them only if any
  // Breaking the channel: the first rank to claim it writes why and whom it names, then
  // publishes broken_by (a release store: the others read the reason after an acquire load).
  std::atomic<int32_t> claimed_by;  // 1 + the rank writing the reason; 0: nobody
  std::atomic<int32_t> broken_by;   // 1 + the rank that broke the channel; 0: whole
  int32_t culprit;                  // the rank the reason names
  int32_t timed_out;                // 1: the reason is a rank that did not come in time
  char reason[232];                 // NUL-terminated
};

// A rank's Call in shared memory (relaxed fields: its arrival's release store publishes them).
struct SharedCall {
  std::atomic<uint32_t> kind;
  std::atomic<uint32_t> type;
  std::atomic<uint32_t> op;
  std::atomic<int32_t> root;
  std::atomic<uint64_t> count;
  std::atomic<uint64_t> offset;
};

struct alignas(kLine) Channel::Control {
  std::atomic<uint64_t> counters[2];  // kArrived, kReduced: the last round published
  SharedCall calls[2];                // per buffer set: what the rank called in its round
  // Note [A rank's life is a robust mutex]: held by the thread that constructed the rank's
  // Channel until it destroys it; usable once `life_set` is 1.
  pthread_mutex_t life;
  std::atomic<uint32_t> life_set;
  std::atomic<int32_t> pid;  // the rank's process id in its own namespace: for the messages only
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the channel's atomics live in shared memory: they must be lock-free");

size_t Channel::region_bytes(int world, size_t slot_bytes) {
  const size_t controls = align_up(sizeof(Header) + static_cast<size_t>(world) * sizeof(Control), kPage);
  return controls + 2 * static_cast<size_t>(world + 1) * slot_bytes;
}

size_t Channel::slot_bytes_for(int world, size_t budget) {
  const size_t per = budget / (2 * static_cast<size_t>(world + 1)) / kPage * kPage;
  return std::clamp(per, kPage, kMaxSlot);
}

Channel::Channel(void* region, int rank, int world, size_t slot_bytes,
                 std::chrono::milliseconds timeout)
    : header_(static_cast<Header*>(region)),
      base_(static_cast<uint8_t*>(region)),
      rank_(rank),
      world_(world),
      slot_bytes_(slot_bytes),
      timeout_(timeout) {
  DDP_CHECK(world >= 1 && rank >= 0 && rank < world, "a channel rank outside its world");
  DDP_CHECK(slot_bytes >= kPage && slot_bytes % kPage == 0, "a channel slot of whole pages");
  // all_to_all and reduce_scatter put a piece for every rank in a slot: at least 8 bytes each.
  DDP_CHECK(slot_bytes / static_cast<size_t>(world) >= 8, "a channel slot too small for its world");
  DDP_CHECK(reinterpret_cast<uintptr_t>(region) % kLine == 0, "a channel region 64-byte aligned");
  Control& mine = control(rank_);
  mine.pid.store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
  // Note [A rank's life is a robust mutex]. Its own rank initializes it, once: the others look
  // at it only after life_set.
  pthread_mutexattr_t attributes;
  ::pthread_mutexattr_init(&attributes);
  ::pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
  ::pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
  const int init = ::pthread_mutex_init(&mine.life, &attributes);
  ::pthread_mutexattr_destroy(&attributes);
  const int locked = init == 0 ? ::pthread_mutex_lock(&mine.life) : init;
  if (locked != 0) {
    throw Error(fmt::format("shared-memory channel: rank {}'s robust mutex: {}", rank,
                            std::strerror(locked)));
  }
  mine.life_set.store(1, std::memory_order_release);
}

Channel::~Channel() {
  // Unlocked before the region can go: a mutex left on this thread's robust list in memory that
  // is unmapped, and then mapped again for something else, would be written by the kernel when
  // the thread ends.
  ::pthread_mutex_unlock(&control(rank_).life);
}

std::string Channel::ended(int rank) const {
  Control& theirs = control(rank);
  if (rank == rank_ || theirs.life_set.load(std::memory_order_acquire) != 1) return "";
  const int32_t pid = theirs.pid.load(std::memory_order_relaxed);
  switch (::pthread_mutex_trylock(&theirs.life)) {
    case EBUSY:
      return "";  // held: its thread lives, running or paused
    case 0:  // nobody holds it: the rank destroyed its Channel
      ::pthread_mutex_unlock(&theirs.life);
      return fmt::format("rank {} (process {}) left the shared-memory channel", rank, pid);
    case EOWNERDEAD:
      // Released without being made consistent: NOTRECOVERABLE from now on, for every looker,
      // and off this thread's robust list.
      ::pthread_mutex_unlock(&theirs.life);
      [[fallthrough]];
    default:  // ENOTRECOVERABLE: another rank found it dead first
      return fmt::format("rank {} (process {}) ended", rank, pid);
  }
}

Channel::Control& Channel::control(int rank) const {
  return reinterpret_cast<Control*>(base_ + sizeof(Header))[rank];
}

uint8_t* Channel::buffer(int set, int rank) const {
  const size_t controls = align_up(sizeof(Header) + static_cast<size_t>(world_) * sizeof(Control), kPage);
  return base_ + controls + (static_cast<size_t>(set) * (world_ + 1) + rank) * slot_bytes_;
}

uint64_t Channel::begin_round(const Call& call) {
  throw_if_broken(call);
  return ++round_;
}

void Channel::throw_if_broken(const Call& call) const {
  const int by = header_->broken_by.load(std::memory_order_acquire);
  if (by == 0) return;
  const std::string reason(header_->reason);
  const int culprit = header_->culprit;
  const bool timed_out = header_->timed_out != 0;
  if (by - 1 == culprit) {
    throw ChannelError(fmt::format("{} during {}", reason, describe(call)), culprit, timed_out);
  }
  throw ChannelError(fmt::format("{} (found by rank {})", reason, by - 1), culprit, timed_out);
}

void Channel::publish(Counter counter, uint64_t round) {
  control(rank_).counters[counter].store(round, std::memory_order_release);
  header_->bell.fetch_add(1, std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&header_->bell);
}

void Channel::fail(const std::string& why, int culprit, bool timed_out) {
  break_channel(why, culprit, timed_out);
  throw ChannelError(why, culprit, timed_out);
}

void Channel::abort() {
  break_channel(fmt::format("rank {} left the shared-memory channel", rank_), rank_, false);
}

void Channel::break_channel(const std::string& why, int culprit, bool timed_out) {
  int32_t nobody = 0;
  if (header_->claimed_by.compare_exchange_strong(nobody, rank_ + 1, std::memory_order_acq_rel)) {
    // Only the first breaker writes: the others' reasons follow from its.
    const size_t n = std::min(why.size(), sizeof(header_->reason) - 1);
    std::memcpy(header_->reason, why.data(), n);
    header_->reason[n] = '\0';
    header_->culprit = culprit;
    header_->timed_out = timed_out ? 1 : 0;
    header_->broken_by.store(rank_ + 1, std::memory_order_release);
  }
  header_->bell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&header_->bell);
}

// A test build of the channel defines this to hold a waiter between its two looks
// (tests/shm/test_channel_teardown.cpp); here it is nothing.
#ifndef DDP_SHM_BETWEEN_LOOKS
#define DDP_SHM_BETWEEN_LOOKS(rank)
#endif

void Channel::wait_all(Counter counter, uint64_t round, const Call& call) {
  const auto all_there = [&] {
    for (int r = 0; r < world_; ++r) {
      if (control(r).counters[counter].load(std::memory_order_acquire) < round) return false;
    }
    return true;
  };
  const auto start = Clock::now();
  auto next_look = start + kLivenessEvery;
  for (int spins = 0;; ++spins) {
    if (all_there()) return;
    DDP_SHM_BETWEEN_LOOKS(rank_);
    // What ends a wait (a broken channel, a rank gone, the timeout) is looked at after the
    // counters, and the counters again after it: between the two looks a rank may complete this
    // round and leave (its group breaks the channel as it goes), and a round that every rank
    // came to completes.
    if (header_->broken_by.load(std::memory_order_acquire) != 0) {
      if (all_there()) return;
      throw_if_broken(call);
    }
    if (spins < kSpins) {
      cpu_relax();
      continue;
    }
    // Sleep until a publication rings the bell. The bell is read before the counters are looked
    // at again: a publication after that look changes it, and futex_wait then returns at once.
    const uint32_t bell = header_->bell.load(std::memory_order_seq_cst);
    if (all_there()) return;
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    futex_wait(&header_->bell, bell);
    header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    const auto now = Clock::now();
    if (now < next_look) continue;
    next_look = now + kLivenessEvery;
    if (const auto failure = look_behind(counter, round, call, now - start)) {
      if (all_there()) return;
      fail(failure->why, failure->culprit, failure->timed_out);
    }
  }
}

std::optional<Channel::Failure> Channel::look_behind(Counter counter, uint64_t round,
                                                     const Call& call,
                                                     Clock::duration waited) const {
  std::vector<int> missing;
  for (int r = 0; r < world_; ++r) {
    if (control(r).counters[counter].load(std::memory_order_acquire) < round) missing.push_back(r);
  }
  for (int r : missing) {
    if (const std::string gone = ended(r); !gone.empty()) {
      return Failure{fmt::format("{} during {}", gone, describe(call)), r, false};
    }
  }
  if (missing.empty() || waited < timeout_) return std::nullopt;
  const double s = static_cast<double>(timeout_.count()) / 1000.0;
  return Failure{
      fmt::format("{} did not arrive at {} within {:g} s", rank_list(missing), describe(call), s),
      missing.front(), true};
}

std::string Channel::describe(const Call& call) {
  static constexpr const char* kOps[] = {"sum", "min", "max", "avg"};
  // An in-place call reads as its staged kind, then where it is.
  const auto in_place = [&](Kind staged) {
    Call as = call;
    as.kind = staged;
    as.root = -1;
    const int up = call.root / kGroupUp;
    return fmt::format("{} in place at byte {} of buffer {}{}", describe(as), call.offset,
                       call.root % kGroupUp, up > 0 ? fmt::format(" ({} group{} up)", up, up > 1 ? "s" : "") : "");
  };
  switch (call.kind) {
    case Kind::kAllReduce:
      return fmt::format("all_reduce({}, {}[{}])", kOps[static_cast<int>(call.op)],
                         dtype_name(call.type), call.count);
    case Kind::kReduceScatter:
      if (call.root >= 0) return in_place(Kind::kReduceScatter);
      return fmt::format("reduce_scatter({}, {}[{}])", kOps[static_cast<int>(call.op)],
                         dtype_name(call.type), call.count);
    case Kind::kAllReduceInPlace: return in_place(Kind::kAllReduce);
    case Kind::kBroadcast: return fmt::format("broadcast(root {}, {} bytes)", call.root, call.count);
    case Kind::kAllGather:
      if (call.root >= 0) return in_place(Kind::kAllGather);
      return fmt::format("all_gather({} bytes)", call.count);
    case Kind::kAllToAll: return fmt::format("all_to_all({} bytes)", call.count);
    case Kind::kBarrier: return "barrier()";
  }
  return "an unknown collective";
}

bool Channel::Call::agrees_with(const Call& o) const {
  if (kind != Kind::kAllGather && kind != Kind::kReduceScatter) return *this == o;
  return kind == o.kind && type == o.type && op == o.op && count == o.count;
}

std::optional<std::pair<std::string, int>> Channel::mismatch(const std::vector<Call>& calls) {
  // The distinct calls, in order of their first rank, with the ranks that made each.
  std::vector<std::pair<Call, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(calls.size()); ++r) {
    auto same = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return g.first.agrees_with(calls[static_cast<size_t>(r)]); });
    if (same == groups.end()) {
      groups.push_back({calls[static_cast<size_t>(r)], {r}});
    } else {
      same->second.push_back(r);
    }
  }
  if (groups.size() < 2) return std::nullopt;
  const auto fewest = std::min_element(groups.rbegin(), groups.rend(), [](const auto& a, const auto& b) {
    return a.second.size() < b.second.size();
  });
  std::vector<std::string> parts;
  const auto say = [&](const auto& g) {
    const bool one = g.second.size() == 1;
    parts.push_back(fmt::format("{} {} {}", rank_list(g.second), one ? "calls" : "call", describe(g.first)));
  };
  say(*fewest);
  for (const auto& g : groups) {
    if (g.second != fewest->second) say(g);
  }
  return std::make_pair(fmt::format("{}", fmt::join(parts, ", ")), fewest->second.front());
}

void Channel::arrive(uint64_t round, const Call& call) {
  const int set = static_cast<int>(round % 2);
  SharedCall& mine = control(rank_).calls[set];
  mine.kind.store(static_cast<uint32_t>(call.kind), std::memory_order_relaxed);
  mine.type.store(static_cast<uint32_t>(call.type), std::memory_order_relaxed);
  mine.op.store(static_cast<uint32_t>(call.op), std::memory_order_relaxed);
  mine.root.store(call.root, std::memory_order_relaxed);
  mine.count.store(call.count, std::memory_order_relaxed);
  mine.offset.store(call.offset, std::memory_order_relaxed);
  publish(kArrived, round);
  wait_all(kArrived, round, call);
  // Set `set` is rewritten only after the next round's barrier, which this rank has not passed.
  std::vector<Call> calls(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    const SharedCall& theirs = control(r).calls[set];
    Call& c = calls[static_cast<size_t>(r)];
    c.kind = static_cast<Kind>(theirs.kind.load(std::memory_order_relaxed));
    c.type = static_cast<DType>(theirs.type.load(std::memory_order_relaxed));
    c.op = static_cast<Op>(theirs.op.load(std::memory_order_relaxed));
    c.root = theirs.root.load(std::memory_order_relaxed);
    c.count = theirs.count.load(std::memory_order_relaxed);
    c.offset = theirs.offset.load(std::memory_order_relaxed);
  }
  // Every rank sees the same calls and fails alike; breaking the channel too ends any wait of a
  // rank that has not looked yet.
  if (const auto differ = mismatch(calls)) fail("ranks disagree: " + differ->first, differ->second, false);
}

void Channel::all_reduce(void* data, size_t count, DType type, Op op) {
  const size_t size = dtype_size(type);
  const size_t per_round = slot_bytes_ / size;
  auto* bytes = static_cast<uint8_t*>(data);
  const Call call{Kind::kAllReduce, type, op, -1, count};
  for (size_t done = 0; done < count; done += per_round) {
    reduce_round(bytes + done * size, std::min(per_round, count - done), call,
                 begin_round(call));
  }
}

void Channel::reduce_round(uint8_t* data, size_t count, const Call& call, uint64_t round) {
  const int set = static_cast<int>(round % 2);
  const DType type = call.type;
  const Op op = call.op;
  const size_t size = dtype_size(type);
  std::memcpy(buffer(set, rank_), data, count * size);
  arrive(round, call);
  std::vector<const void*> inputs(static_cast<size_t>(world_));
  if (world_ <= 2 || count * size <= kWholeChunkBytes) {
    for (int r = 0; r < world_; ++r) inputs[static_cast<size_t>(r)] = buffer(set, r);
    reduce(type, op, data, inputs.data(), world_, count);
    return;
  }
  // This rank's slice of the chunk, combined into the result area.
  const auto [lo, hi] = slice(count, size);
  for (int r = 0; r < world_; ++r) inputs[static_cast<size_t>(r)] = buffer(set, r) + lo * size;
  uint8_t* result = buffer(set, world_);
  reduce(type, op, result + lo * size, inputs.data(), world_, hi - lo);
  publish(kReduced, round);
  wait_all(kReduced, round, call);
  std::memcpy(data, result, count * size);
}

std::pair<size_t, size_t> Channel::slice(size_t count, size_t element_bytes) const {
  // Whole cache lines: no two ranks write the same line.
  const size_t line = std::max<size_t>(1, kLine / element_bytes);
  const size_t per = align_up((count + static_cast<size_t>(world_) - 1) / world_, line);
  const size_t lo = std::min(count, static_cast<size_t>(rank_) * per);
  return {lo, std::min(count, lo + per)};
}

void Channel::all_reduce_in_place(uint8_t* const* copies, size_t count, DType type, Op op,
                                  int buffer, uint64_t offset) {
  const Call call{Kind::kAllReduceInPlace, type, op, buffer, count, offset};
  const uint64_t round = begin_round(call);
  arrive(round, call);  // every copy holds its rank's input (published with its arrival)
  const size_t size = dtype_size(type);
  const auto [lo, hi] = slice(count, size);
  // A block at a time, so that the result is still in the cache when it is copied to the other
  // ranks' copies: the slice is read from memory once and written once per copy.
  constexpr size_t kBlockBytes = 16 << 10;
  const size_t block = std::max<size_t>(1, kBlockBytes / size);
  std::vector<const void*> inputs(static_cast<size_t>(world_));
  for (size_t begin = lo; begin < hi; begin += block) {
    const size_t n = std::min(block, hi - begin);
    for (int r = 0; r < world_; ++r) inputs[static_cast<size_t>(r)] = copies[r] + begin * size;
    reduce(type, op, copies[0] + begin * size, inputs.data(), world_, n);
    for (int r = 1; r < world_; ++r) std::memcpy(copies[r] + begin * size, copies[0] + begin * size, n * size);
  }
  leave_copies(round, call);
}

void Channel::leave_copies(uint64_t round, const Call& call) {
  publish(kReduced, round);
  wait_all(kReduced, round, call);
}

std::optional<std::vector<const uint8_t*>> Channel::copies_of(uint64_t round, const Call& call,
                                                              const uint8_t* mine, size_t bytes,
                                                              const Locate& locate) {
  const int set = static_cast<int>(round % 2);
  // Published with the arrivals (the calls' set is rewritten only after the next round's barrier).
  for (int r = 0; r < world_; ++r) {
    if (control(r).calls[set].root.load(std::memory_order_relaxed) < 0) return std::nullopt;
  }
  std::vector<const uint8_t*> copies(static_cast<size_t>(world_), mine);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    Call where = call;
    where.root = control(r).calls[set].root.load(std::memory_order_relaxed);
    where.offset = control(r).calls[set].offset.load(std::memory_order_relaxed);
    copies[static_cast<size_t>(r)] = locate(r, where.root, where.offset, bytes);
    if (copies[static_cast<size_t>(r)] == nullptr) {
      fail(fmt::format("rank {} cannot reach rank {}'s memory of {}", rank_, r, describe(where)), r,
           false);
    }
  }
  return copies;
}

void Channel::all_gather(void* out, const void* in, size_t bytes, const Place* place) {
  auto* o = static_cast<uint8_t*>(out);
  const auto* i = static_cast<const uint8_t*>(in);
  const Call call{Kind::kAllGather, DType::kUInt8, Op::kSum, place ? place->buffer : -1, bytes,
                  place ? place->offset : 0};
  uint8_t* own_block = o + static_cast<size_t>(rank_) * bytes;
  // This rank's part in its own block, published with its arrival.
  if (place != nullptr && i != own_block && bytes > 0) std::memmove(own_block, i, bytes);
  const uint64_t round = begin_round(call);
  arrive(round, call);  // every rank says where its output lies, if anywhere
  const size_t whole = static_cast<size_t>(world_) * bytes;
  if (const auto outputs = place ? copies_of(round, call, o, whole, place->locate) : std::nullopt) {
    for (int r = 0; r < world_; ++r) {
      const size_t at = static_cast<size_t>(r) * bytes;
      if (r != rank_ && bytes > 0) std::memcpy(o + at, (*outputs)[static_cast<size_t>(r)] + at, bytes);
    }
    leave_copies(round, call);
    return;
  }
  all_gather_staged(o, place ? own_block : i, bytes, call);
}

void Channel::reduce_scatter(void* out, const void* in, size_t count, DType type, Op op,
                             const Place* place) {
  const size_t block = count * dtype_size(type);
  auto* o = static_cast<uint8_t*>(out);
  const auto* i = static_cast<const uint8_t*>(in);
  const uint8_t* own_block = i + static_cast<size_t>(rank_) * block;
  // Written while the others read `in`: only this rank's block of it, which they do not.
  DDP_CHECK(!place || o == own_block || o + block <= i || o >= i + static_cast<size_t>(world_) * block,
            "reduce_scatter in place: the output overlaps the input outside this rank's block");
  const Call call{Kind::kReduceScatter, type, op, place ? place->buffer : -1, count,
                  place ? place->offset : 0};
  const uint64_t round = begin_round(call);
  arrive(round, call);  // every rank says where its input lies, if anywhere
  const size_t whole = static_cast<size_t>(world_) * block;
  if (const auto ins = place ? copies_of(round, call, i, whole, place->locate) : std::nullopt) {
    reduce_scatter_copies(o, *ins, count, call);
    leave_copies(round, call);
    return;
  }
  reduce_scatter_staged(o, i, count, call);
}

void Channel::reduce_scatter_copies(void* out, const std::vector<const uint8_t*>& ins,
                                    size_t count, const Call& call) const {
  if (count == 0) return;  // `out` may be null then
  const size_t size = dtype_size(call.type);
  const size_t block = count * size;
  std::vector<const void*> inputs(static_cast<size_t>(world_));
  for (size_t r = 0; r < inputs.size(); ++r) inputs[r] = ins[r] + static_cast<size_t>(rank_) * block;
  if (out != inputs[static_cast<size_t>(rank_)] || rank_ == 0) {
    reduce(call.type, call.op, out, inputs.data(), world_, count);  // `out` may be inputs[0] only
    return;
  }
  // Into this rank's own block, which is inputs[rank]: a part at a time through scratch memory.
  constexpr size_t kScratchBytes = 16 << 10;
  const size_t per = std::max<size_t>(1, kScratchBytes / size);
  std::vector<uint8_t> scratch(per * size);
  std::vector<const void*> part(inputs.size());
  for (size_t begin = 0; begin < count; begin += per) {
    const size_t n = std::min(per, count - begin);
    for (size_t r = 0; r < inputs.size(); ++r) {
      part[r] = static_cast<const uint8_t*>(inputs[r]) + begin * size;
    }
    reduce(call.type, call.op, scratch.data(), part.data(), world_, n);
    std::memcpy(static_cast<uint8_t*>(out) + begin * size, scratch.data(), n * size);
  }
}

void Channel::broadcast(void* data, size_t bytes, int root) {
  DDP_CHECK(root >= 0 && root < world_, "a broadcast root outside the world");
  auto* d = static_cast<uint8_t*>(data);
  const Call call{Kind::kBroadcast, DType::kUInt8, Op::kSum, root, bytes};
  for (size_t done = 0; done < bytes; done += slot_bytes_) {
    const size_t n = std::min(slot_bytes_, bytes - done);
    const uint64_t round = begin_round(call);
    const int set = static_cast<int>(round % 2);
    if (rank_ == root) std::memcpy(buffer(set, root), d + done, n);
    arrive(round, call);
    if (rank_ != root) std::memcpy(d + done, buffer(set, root), n);
  }
}

void Channel::all_gather_staged(uint8_t* out, const uint8_t* in, size_t bytes, const Call& call) {
  for (size_t done = 0; done < bytes; done += slot_bytes_) {
    const size_t n = std::min(slot_bytes_, bytes - done);
    const uint64_t round = begin_round(call);
    const int set = static_cast<int>(round % 2);
    std::memcpy(buffer(set, rank_), in + done, n);
    arrive(round, call);
    // From the slots, this rank's too: `in` may be a part of `out`.
    for (int r = 0; r < world_; ++r) std::memcpy(out + r * bytes + done, buffer(set, r), n);
  }
}

void Channel::all_to_all(void* out, const void* in, size_t block_bytes) {
  auto* o = static_cast<uint8_t*>(out);
  const auto* i = static_cast<const uint8_t*>(in);
  const size_t per_round = slot_bytes_ / static_cast<size_t>(world_);
  const Call call{Kind::kAllToAll, DType::kUInt8, Op::kSum, -1, block_bytes};
  for (size_t done = 0; done < block_bytes; done += per_round) {
    const size_t n = std::min(per_round, block_bytes - done);
    const uint64_t round = begin_round(call);
    const int set = static_cast<int>(round % 2);
    uint8_t* slot = buffer(set, rank_);
    for (int q = 0; q < world_; ++q) std::memcpy(slot + q * n, i + q * block_bytes + done, n);
    arrive(round, call);
    for (int q = 0; q < world_; ++q) {
      std::memcpy(o + q * block_bytes + done, buffer(set, q) + rank_ * n, n);
    }
  }
}

void Channel::reduce_scatter_staged(uint8_t* out, const uint8_t* in, size_t count,
                                    const Call& call) {
  const size_t size = dtype_size(call.type);
  const size_t block = count * size;
  const size_t per_round = slot_bytes_ / static_cast<size_t>(world_) / size;
  std::vector<const void*> inputs(static_cast<size_t>(world_));
  for (size_t done = 0; done < count; done += per_round) {
    const size_t n = std::min(per_round, count - done);
    const uint64_t round = begin_round(call);
    const int set = static_cast<int>(round % 2);
    uint8_t* slot = buffer(set, rank_);
    for (int q = 0; q < world_; ++q) {
      std::memcpy(slot + q * n * size, in + q * block + done * size, n * size);
    }
    arrive(round, call);
    for (int r = 0; r < world_; ++r) {
      inputs[static_cast<size_t>(r)] = buffer(set, r) + static_cast<size_t>(rank_) * n * size;
    }
    reduce(call.type, call.op, out + done * size, inputs.data(), world_, n);
  }
}

void Channel::barrier() {
  const Call call;
  arrive(begin_round(call), call);
}

}  // namespace ddp::comm::shm
