#pragma once
// The buffers a shared-memory group allocated (ProcessGroup::allocate_buffer on shm), and those
// of the groups it was made from: where every rank's copy of a buffer lies in this process, for
// the collectives that read the other ranks' copies in place. Free of LibTorch, as the channel.
//
// Note [The buffers a group reaches]
// A group's buffer holds a copy per rank in one segment that every rank maps: rank r's at base +
// r * stride. A subgroup made from the group (new_group) reaches them too, each member at its rank
// in the group: FSDP reduce-scatters on a subgroup of every rank (Note [Units unused on some
// ranks]) the gradients it keeps in its group's buffers, and they are reduced in place there all
// the same. The number a buffer goes by in a collective (the channel compares and publishes it)
// is its id in the group that made it, plus Channel::kGroupUp for each group up from the
// caller's: different groups' buffers never share a number. A buffer is forgotten once every
// tensor of it (which hold its segment) is gone: an address of its may belong to other memory
// then.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "ddp/comm/shm/segment.h"

namespace ddp::comm::shm {

class GroupBuffers {
 public:
  // A group of `world` ranks, this process its rank `rank`, reaching no other group's buffers.
  GroupBuffers(int rank, int world);

  // The group's next buffer: `bytes` a rank, rank r's copy at base + r * stride of `segment`
  // (mapped as long as a tensor of it holds it). Its number is the next of this group's.
  void add(const std::shared_ptr<Segment>& segment, size_t stride, size_t bytes);

  // Where `bytes` from `data` lie whole in one copy of this rank's: the buffer's number, the byte
  // in it, and every rank's copy of that place (rank order). nullopt where they do not.
  struct Place {
    int buffer;
    uint64_t offset;
    std::vector<uint8_t*> copies;
  };
  std::optional<Place> find(const void* data, size_t bytes) const;
  // Rank `rank`'s copy of `bytes` from byte `offset` of buffer number `buffer`, its segment added
  // to `held` (mapped until the caller drops it); nullptr where this process does not map that
  // buffer (any more) or it does not hold them.
  const uint8_t* copy_of(int rank, int buffer, uint64_t offset, size_t bytes,
                         std::vector<std::shared_ptr<Segment>>& held) const;
  // What a subgroup of `ranks` (sorted ranks of this group; `rank` its rank in it) reaches: this
  // group's buffers and those this group reaches, each of its members at its rank there.
  GroupBuffers subgroup(const std::vector<int>& ranks, int rank) const;

 private:
  struct Buffer {
    int id;
    std::weak_ptr<Segment> segment;  // expired: every tensor of it is gone, its memory too
    uint8_t* base;
    size_t stride;
    size_t bytes;
  };
  // One group's buffers, shared with the subgroups made from it (which look from other threads).
  struct Table {
    std::mutex mutex;
    std::vector<Buffer> list;
    int next_id = 0;
  };
  // A group's table, and member i's rank in that group.
  struct Reach {
    std::shared_ptr<Table> table;
    std::vector<int> ranks;
  };
  int rank_;
  std::vector<Reach> reach_;  // this group's first, then the one it was made from, and so on up
};

}  // namespace ddp::comm::shm
