// The buffers a shared-memory group reaches (comm/shm/buffers.h): where a pointer lies in this
// rank's copies, every rank's copy of that place, the numbers of a group's buffers and of its
// parent's, a subgroup's members at their ranks in the parent, and a buffer forgotten once its
// memory is gone. One process stands for every rank: each copy is a stride of one segment.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/shm/buffers.h"
#include "ddp/comm/shm/channel.h"
#include "ddp/comm/shm/segment.h"

namespace {

using ddp::comm::shm::Channel;
using ddp::comm::shm::GroupBuffers;
using ddp::comm::shm::Segment;

constexpr size_t kStride = 4096;

// A segment of `world` copies of kStride bytes, its name gone from /dev/shm at once.
std::shared_ptr<Segment> copies(int world) {
  static int made = 0;
  const std::string name =
      "/ddp-test-buffers-" + std::to_string(::getpid()) + "-" + std::to_string(made++);
  auto segment =
      std::make_shared<Segment>(Segment::create(name, kStride * static_cast<size_t>(world)));
  Segment::remove(name);
  return segment;
}

uint8_t* copy(const std::shared_ptr<Segment>& segment, int rank) {
  return static_cast<uint8_t*>(segment->data()) + kStride * static_cast<size_t>(rank);
}

TEST(ShmGroupBuffers, APointerInThisRanksCopyIsFoundWithEveryRanksCopyOfItsPlace) {
  GroupBuffers buffers(/*rank=*/1, /*world=*/3);
  const auto first = copies(3);
  const auto second = copies(3);
  buffers.add(first, kStride, 1000);
  buffers.add(second, kStride, 4000);
  const auto place = buffers.find(copy(second, 1) + 64, 400);
  ASSERT_TRUE(place.has_value());
  EXPECT_EQ(place->buffer, 1);
  EXPECT_EQ(place->offset, 64u);
  ASSERT_EQ(place->copies.size(), 3u);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(place->copies[static_cast<size_t>(r)], copy(second, r) + 64);
  // Another rank's copy, past the buffer's bytes, or across its end: not this rank's.
  EXPECT_FALSE(buffers.find(copy(second, 0) + 64, 400).has_value());
  EXPECT_FALSE(buffers.find(copy(first, 1) + 900, 200).has_value());
  EXPECT_TRUE(buffers.find(copy(first, 1) + 900, 100).has_value());
  std::vector<std::shared_ptr<Segment>> held;
  EXPECT_EQ(buffers.copy_of(2, 1, 64, 400, held), copy(second, 2) + 64);
  EXPECT_EQ(held.size(), 1u);
  EXPECT_EQ(buffers.copy_of(2, 1, 3900, 400, held), nullptr);  // past the buffer's 4000 bytes
  EXPECT_EQ(buffers.copy_of(2, 7, 0, 4, held), nullptr);       // no buffer 7
  EXPECT_EQ(buffers.copy_of(2, Channel::kGroupUp, 0, 4, held), nullptr);  // no group above
}

TEST(ShmGroupBuffers, ASubgroupReachesItsParentsBuffersAtItsMembersRanksThere) {
  // Ranks 1 and 3 of 4 make a subgroup; this process is rank 3, the subgroup's rank 1.
  GroupBuffers parent(/*rank=*/3, /*world=*/4);
  const auto mine = copies(4);
  parent.add(mine, kStride, 4096);
  GroupBuffers sub = parent.subgroup({1, 3}, /*rank=*/1);
  const auto own = copies(2);
  sub.add(own, kStride, 4096);
  const auto inherited = sub.find(copy(mine, 3) + 8, 16);
  ASSERT_TRUE(inherited.has_value());
  EXPECT_EQ(inherited->buffer, Channel::kGroupUp);  // the parent's buffer 0, a group up
  EXPECT_EQ(inherited->copies, (std::vector<uint8_t*>{copy(mine, 1) + 8, copy(mine, 3) + 8}));
  const auto its_own = sub.find(copy(own, 1), 16);
  ASSERT_TRUE(its_own.has_value());
  EXPECT_EQ(its_own->buffer, 0);
  std::vector<std::shared_ptr<Segment>> held;
  EXPECT_EQ(sub.copy_of(0, Channel::kGroupUp, 8, 16, held), copy(mine, 1) + 8);
  EXPECT_EQ(sub.copy_of(0, 0, 8, 16, held), copy(own, 0) + 8);
  // The parent's buffers added after the subgroup was made are reached too.
  const auto later = copies(4);
  parent.add(later, kStride, 100);
  const auto found = sub.find(copy(later, 3), 100);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->buffer, Channel::kGroupUp + 1);
}

TEST(ShmGroupBuffers, ABufferWhoseMemoryIsGoneIsNotFound) {
  GroupBuffers buffers(0, 2);
  auto segment = copies(2);
  buffers.add(segment, kStride, 4096);
  const uint8_t* at = copy(segment, 0);
  std::vector<std::shared_ptr<Segment>> held;
  segment.reset();  // every tensor of it gone: unmapped
  EXPECT_FALSE(buffers.find(at, 16).has_value());
  EXPECT_EQ(buffers.copy_of(1, 0, 0, 16, held), nullptr);
}

}  // namespace
