#pragma once
// Included first into the test build of the shared-memory channel (tests/CMakeLists.txt,
// ddp_shm_teardown_tests): a waiter calls between_looks(rank) between its look at the ranks'
// counters and its look at whether the channel is broken, where the test holds it.
namespace ddp::testing {
void between_looks(int rank);
}  // namespace ddp::testing
#define DDP_SHM_BETWEEN_LOOKS(rank) ::ddp::testing::between_looks(rank)
