#include "ddp/comm/shm/buffers.h"

#include <algorithm>

#include "ddp/comm/shm/channel.h"

namespace ddp::comm::shm {

GroupBuffers::GroupBuffers(int rank, int world) : rank_(rank) {
  Reach own{std::make_shared<Table>(), {}};
  for (int r = 0; r < world; ++r) own.ranks.push_back(r);
  reach_.push_back(std::move(own));
}

void GroupBuffers::add(const std::shared_ptr<Segment>& segment, size_t stride, size_t bytes) {
  Table& own = *reach_.front().table;
  std::lock_guard<std::mutex> lock(own.mutex);
  // Forget the buffers whose memory is gone: an address of theirs may belong to another now.
  own.list.erase(std::remove_if(own.list.begin(), own.list.end(),
                                [](const Buffer& b) { return b.segment.expired(); }),
                 own.list.end());
  own.list.push_back(
      Buffer{own.next_id++, segment, static_cast<uint8_t*>(segment->data()), stride, bytes});
}

std::optional<GroupBuffers::Place> GroupBuffers::find(const void* data, size_t bytes) const {
  const auto* at = static_cast<const uint8_t*>(data);
  for (size_t level = 0; level < reach_.size(); ++level) {
    const Reach& reach = reach_[level];
    std::lock_guard<std::mutex> lock(reach.table->mutex);
    for (const Buffer& b : reach.table->list) {
      const uint8_t* mine =
          b.base + static_cast<size_t>(reach.ranks[static_cast<size_t>(rank_)]) * b.stride;
      // A live tensor inside a buffer keeps it mapped: one that lies there is of this buffer,
      // unless the buffer has expired and its addresses were given to other memory.
      if (at < mine || at + bytes > mine + b.bytes || b.segment.expired()) continue;
      Place place{
          b.id + static_cast<int>(level) * Channel::kGroupUp, static_cast<uint64_t>(at - mine), {}};
      for (int r : reach.ranks) {
        place.copies.push_back(b.base + static_cast<size_t>(r) * b.stride + place.offset);
      }
      return place;
    }
  }
  return std::nullopt;
}

const uint8_t* GroupBuffers::copy_of(int rank, int buffer, uint64_t offset, size_t bytes,
                                     std::vector<std::shared_ptr<Segment>>& held) const {
  const auto level = static_cast<size_t>(buffer / Channel::kGroupUp);
  if (buffer < 0 || level >= reach_.size()) return nullptr;
  const int id = buffer % Channel::kGroupUp;
  const Reach& reach = reach_[level];
  std::lock_guard<std::mutex> lock(reach.table->mutex);
  for (const Buffer& b : reach.table->list) {
    if (b.id != id) continue;
    auto segment = b.segment.lock();
    if (!segment || offset > b.bytes || bytes > b.bytes - offset) return nullptr;
    held.push_back(std::move(segment));
    return b.base + static_cast<size_t>(reach.ranks[static_cast<size_t>(rank)]) * b.stride + offset;
  }
  return nullptr;
}

GroupBuffers GroupBuffers::subgroup(const std::vector<int>& ranks, int rank) const {
  GroupBuffers sub(rank, static_cast<int>(ranks.size()));
  for (const Reach& reach : reach_) {
    Reach theirs{reach.table, {}};
    for (int r : ranks) theirs.ranks.push_back(reach.ranks[static_cast<size_t>(r)]);
    sub.reach_.push_back(std::move(theirs));
  }
  return sub;
}

}  // namespace ddp::comm::shm
