// Which device a rank trains on (train/distributed.h's resolve_device), as a pure function of the
// key's value, the GPUs the process sees, its local rank and whether its backend lets ranks share
// a GPU. Building a CUDA device needs no GPU: these run on every machine.
#include <gtest/gtest.h>

#include "ddp/common/error.h"
#include "ddp/train/distributed.h"

namespace {

using ddp::train::resolve_device;

TEST(Device, AutoIsTheLocalRanksGpuWhereThereAreGpusAndTheCpuWhereThereAreNone) {
  EXPECT_EQ(resolve_device("auto", 0, 3), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device("auto", 4, 3), torch::Device(torch::kCUDA, 3));
  EXPECT_EQ(resolve_device("cpu", 4, 3), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device("cuda", 2, 1), torch::Device(torch::kCUDA, 1));
}

TEST(Device, ALocalRankWithoutAGpuOfItsOwnIsRefusedUnlessItsBackendShares) {
  try {
    resolve_device("cuda", 1, 1);
    FAIL() << "local rank 1 of one GPU was given a device";
  } catch (const ddp::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("local rank 1 has no GPU of its own: 1 visible"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--backend gloo"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_device("auto", 2, 2), ddp::InputError);
  // gloo: the ranks go round the GPUs.
  EXPECT_EQ(resolve_device("cuda", 1, 1, /*share_gpus=*/true), torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(resolve_device("auto", 2, 3, /*share_gpus=*/true), torch::Device(torch::kCUDA, 1));
  EXPECT_EQ(resolve_device("auto", 0, 3, /*share_gpus=*/true), torch::Device(torch::kCPU));
}

TEST(Device, CudaWithoutAGpuAndAnUnknownNameAreRefusedNamingTheKey) {
  EXPECT_THROW(
      {
        try {
          resolve_device("cuda", 0, 0, true);
        } catch (const ddp::InputError& e) {
          EXPECT_NE(std::string(e.what()).find("key 'device'"), std::string::npos) << e.what();
          throw;
        }
      },
      ddp::InputError);
  EXPECT_THROW(resolve_device("gpu", 1, 0), ddp::InputError);
}

}  // namespace
