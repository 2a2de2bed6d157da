#pragma once
// The collectives of ranks on one host through one shared-memory region (a Segment's, or any
// memory the ranks share: threads of one process in the tests). Free of LibTorch (see reduce.h).
//
// Note [Rounds of the shared-memory channel]
// The region holds a control block per rank and two sets of buffers, each a slot per rank and a
// result area of `slot_bytes`. A collective moves its data in rounds of at most a slot; round k
// (counted over the channel's life, the same on every rank) uses set k % 2:
//
//   1. each rank copies its part into its slot and publishes arrived = k;
//   2. it waits until every rank has arrived at k (the barrier of the round);
//   3. it reads what it needs of the others' slots: an all-gather copies them all, a small
//      all-reduce combines them all, a large one combines only this rank's slice of the chunk
//      into the result area, publishes reduced = k, waits for every rank's, and copies the
//      whole result out.
//
// An all-reduce of buffers that every rank can address (its own and the others' copies, at the
// same place of one region each rank maps: the group's buffers, shm_backend.cpp) needs no slot:
// after the round's barrier each rank combines its slice of every copy, in rank order, writes the
// result into every copy, publishes reduced = k and waits for every rank's. Each byte is read
// once and written once per rank it belongs to: a memcpy's traffic, the floor. An all-gather
// into such memory is one round too: each rank writes its part into its own output's block before
// the barrier and then copies the others' blocks from their outputs; a reduce-scatter of such
// inputs combines block `rank` of every rank's input, in rank order, into this rank's output.
// Their ranks' copies need not lie at one place: each rank publishes where its own lies (a
// buffer and a byte in it: a Place) with its call, and the others find it there (Locate). Both
// then publish reduced = k and wait for every rank's, so that no rank writes its copy again while
// another still reads it. Neither goes through a slot, whatever the size. Every all-gather and
// reduce-scatter begins with that round; where a rank gave no Place (its memory is ordinary,
// while another's lies in a buffer: FSDP's units take a slot of the group's buffers where one is
// free on their rank), it only says so, and the staged rounds follow on every rank.
//
// A rank writes set k % 2 in round k only after round k - 1's barrier, which every rank passes
// only once it has finished round k - 2, the last to use that set: two sets are enough, and a
// round costs one barrier (two for a sliced all-reduce). Published values are release stores
// read with acquire loads, so a slot's data is visible once its rank's counter is.
//
// Each rank also writes what it called (the collective, its type, operation, root and size) into
// its control block, per buffer set, before its arrival; after the barrier every rank compares
// the others' calls with its own, so ranks that issue different collectives all fail at once,
// naming both calls, instead of exchanging mismatched bytes.
//
// Waiting spins briefly, then sleeps on a futex in the region that every publication rings.
// A rank that fails (its timeout, an error) marks the channel broken with its reason: the others
// stop waiting at once and their error gives that reason, naming the rank it names. A rank that
// dies is seen within 100 ms (Note [A rank's life is a robust mutex]).
//
// Note [A rank's life is a robust mutex]
// Each rank's control block holds a robust, process-shared mutex that the thread constructing
// the rank's Channel locks, and holds until it destroys the Channel. When that thread ends
// without unlocking it (its process was killed, or exited with the Channel alive), the kernel
// marks the mutex "owner died": a waiter's trylock on the mutex of a rank it waits for then says
// EOWNERDEAD, where it says EBUSY while the owner lives, running or stopped (SIGSTOP). Unlike a
// process id probed with kill(pid, 0), this holds across PID namespaces (containers that share
// /dev/shm but not their pids, where a pid names another process or none), for a zombie not yet
// reaped, and for a pid the system has already given to a new process. So a Channel is
// constructed and destroyed on a thread that lives as long as its rank takes part: the group's
// own thread in comm/backends/shm_backend.cpp.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/shm/reduce.h"
#include "ddp/common/error.h"

namespace ddp::comm::shm {

// A collective of the channel that failed: a rank that did not arrive within the timeout, a
// rank that is gone or that broke the channel. The channel is unusable afterwards.
class ChannelError : public Error {
 public:
  ChannelError(const std::string& what, int culprit, bool timed_out)
      : Error(what), culprit_(culprit), timed_out_(timed_out) {}
  int culprit() const { return culprit_; }       // the rank named
  bool timed_out() const { return timed_out_; }  // a rank did not come within the timeout

 private:
  int culprit_;
  bool timed_out_;
};

class Channel {
 public:
  // The bytes a channel of `world` ranks with slots of `slot_bytes` needs.
  static size_t region_bytes(int world, size_t slot_bytes);
  // The slot size for `world` ranks within `budget` bytes of region: a multiple of 4 KiB, at
  // most 4 MiB (rounds of more gain nothing), at least 4 KiB. A pure function.
  static size_t slot_bytes_for(int world, size_t budget);

  // `region`: region_bytes(world, slot_bytes), zero-filled before the first rank attaches (a new
  // segment is), 64-byte aligned. Every rank constructs its own Channel on the same region with
  // the same world and slot_bytes. `timeout`: how long one collective may wait for the others.
  // Construct and destroy it on the same thread, one that lives while the rank takes part.
  Channel(void* region, int rank, int world, size_t slot_bytes, std::chrono::milliseconds timeout);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  size_t slot_bytes() const { return slot_bytes_; }

  // In place over `count` elements of `type`: data = data(0) op ... op data(world-1).
  void all_reduce(void* data, size_t count, DType type, Op op);
  // The same over copies that every rank can address: copies[r] is rank r's, in this process's
  // memory, and every rank passes its own view of the same copies (the same `buffer`, the same
  // byte `offset` in it: checked as the call). Afterwards every copy holds the reduction.
  void all_reduce_in_place(uint8_t* const* copies, size_t count, DType type, Op op, int buffer,
                           uint64_t offset);
  // Where another rank's copy lies in this process: rank `rank`'s `bytes` from byte `offset` of
  // `buffer` (what that rank published), or nullptr where this process cannot address them. It
  // keeps what it returns addressable until the collective returns.
  using Locate = std::function<const uint8_t*(int rank, int buffer, uint64_t offset, size_t bytes)>;
  // Where this rank's memory of an all-gather's output or a reduce-scatter's input lies, for the
  // others to read it in place: byte `offset` of `buffer` (each rank's may lie elsewhere), and how
  // to find the others'.
  struct Place {
    int buffer;
    uint64_t offset;
    Locate locate;
  };
  // `bytes` of root's data to every rank.
  void broadcast(void* data, size_t bytes, int root);
  // Rank r's `bytes` of `in` at out + r * bytes. `in` may be this rank's block of `out`. Where
  // every rank gives the Place of its `out`, in place (Note [Rounds of the shared-memory
  // channel]); otherwise staged, after a first round in which the ranks say where theirs lie.
  void all_gather(void* out, const void* in, size_t bytes, const Place* place = nullptr);
  // `in` holds world blocks of `count` elements; `out` (count elements) receives the reduction
  // of block `rank` over the ranks, in rank order. Where every rank gives the Place of its `in`,
  // in place; `out` may then be this rank's block of `in` but must not overlap the rest of it.
  void reduce_scatter(void* out, const void* in, size_t count, DType type, Op op,
                      const Place* place = nullptr);
  // `in` and `out` hold world blocks of `block_bytes`: block q of `in` goes to rank q, block q of
  // `out` came from rank q.
  void all_to_all(void* out, const void* in, size_t block_bytes);
  void barrier();

  // A Place's `buffer`: a number every rank gives the same buffer; kGroupUp for each
  // group up from the caller's that made it (a subgroup reaching its parent's buffers, in
  // comm/backends/shm_backend.cpp), so that different groups' buffers never share a number.
  static constexpr int kGroupUp = 1 << 20;
  // One rank's call, as the others see it. `count`: elements for the reductions, bytes for the
  // others. kAllReduceInPlace, and an all-gather or reduce-scatter given a Place: `root` is the
  // buffer, `offset` the byte in it (-1 and 0 without a Place).
  enum class Kind : uint32_t {
    kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kBarrier, kAllReduceInPlace
  };
  struct Call {
    Kind kind = Kind::kBarrier;
    DType type = DType::kUInt8;
    Op op = Op::kSum;
    int root = -1;
    uint64_t count = 0;
    uint64_t offset = 0;
    bool operator==(const Call& o) const {
      return kind == o.kind && type == o.type && op == o.op && root == o.root &&
             count == o.count && offset == o.offset;
    }
    // The same collective: equal, but for where each rank's memory of an all-gather or
    // reduce-scatter lies.
    bool agrees_with(const Call& o) const;
  };
  // "all_reduce(sum, float32[3])", "broadcast(root 0, 40 bytes)", ... A pure function.
  static std::string describe(const Call& call);
  // The message where the ranks' calls differ, grouping the ranks by call ("rank 1 calls ...,
  // ranks 0 and 2 call ..."), and the rank it names (the first of the fewest that agree, the
  // later group on a tie); nullopt where all agree. A pure function.
  static std::optional<std::pair<std::string, int>> mismatch(const std::vector<Call>& calls);

  // Marks the channel broken by this rank (the others' waits end naming it), as a failed
  // collective does on its own. For a rank that leaves mid-job.
  void abort();

 private:
  struct Control;
  struct Header;
  enum Counter { kArrived, kReduced };

  Control& control(int rank) const;
  // Set `set`'s slot of `rank`, or its result area for rank == world.
  uint8_t* buffer(int set, int rank) const;
  // The next round's number; throws ChannelError where the channel is broken.
  uint64_t begin_round(const Call& call);
  void throw_if_broken(const Call& call) const;
  // Records why (the first breaker's reason wins) and wakes every waiter.
  void break_channel(const std::string& why, int culprit, bool timed_out);
  void publish(Counter counter, uint64_t round);
  // Until every rank's `counter` reaches `round`; throws ChannelError (and breaks the channel)
  // on the timeout, a broken channel or a rank gone.
  void wait_all(Counter counter, uint64_t round, const Call& call);
  // Why a wait of `waited` for the ranks behind at `round` ends: one of them ended or left, or
  // the timeout passed; nullopt while it goes on.
  struct Failure {
    std::string why;
    int culprit;
    bool timed_out;
  };
  std::optional<Failure> look_behind(Counter counter, uint64_t round, const Call& call,
                                     std::chrono::steady_clock::duration waited) const;
  // "rank 2 (process 7) ended" where `rank` is gone (Note [A rank's life is a robust mutex]),
  // "... left the shared-memory channel" where it destroyed its Channel, "" while it lives.
  std::string ended(int rank) const;
  [[noreturn]] void fail(const std::string& why, int culprit, bool timed_out);
  void reduce_round(uint8_t* data, size_t count, const Call& call, uint64_t round);
  // This rank's slice of `count` elements, whole cache lines: [first, second).
  std::pair<size_t, size_t> slice(size_t count, size_t element_bytes) const;
  // Writes this rank's call for the round, publishes its arrival, waits for every rank's, and
  // throws ChannelError (every rank does) where their calls differ.
  void arrive(uint64_t round, const Call& call);
  // The end of an in-place round: this rank is done with the others' copies; returns once every
  // rank is, so that its own copy may be written again.
  void leave_copies(uint64_t round, const Call& call);
  // Every rank's copy in round `round` (this rank's is `mine`), `bytes` of each, where each
  // published it, found by `locate`: nullopt where some rank gave no Place; breaks the channel
  // naming the first that cannot be found.
  std::optional<std::vector<const uint8_t*>> copies_of(uint64_t round, const Call& call,
                                                       const uint8_t* mine, size_t bytes,
                                                       const Locate& locate);
  // The staged all-gather and reduce-scatter, in rounds of a slot.
  void all_gather_staged(uint8_t* out, const uint8_t* in, size_t bytes, const Call& call);
  void reduce_scatter_staged(uint8_t* out, const uint8_t* in, size_t count, const Call& call);
  // The reduce-scatter of inputs every rank can address (`ins`, one per rank).
  void reduce_scatter_copies(void* out, const std::vector<const uint8_t*>& ins, size_t count,
                             const Call& call) const;

  Header* header_;
  uint8_t* base_;
  int rank_;
  int world_;
  size_t slot_bytes_;
  std::chrono::milliseconds timeout_;
  uint64_t round_ = 0;
};

}  // namespace ddp::comm::shm
