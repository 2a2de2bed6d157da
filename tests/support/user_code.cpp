#include "user_code.h"

#include <chrono>
#include <thread>

#include "ddp/common/log.h"

// noinline: the function stays a frame of its own, as a larger one of a user's would be.
[[gnu::noinline]] void wait_in_user_code(double seconds, int rank, const std::string& where) {
  constexpr int kSleepLine = __LINE__ + 4;
  ddp::log::warn("rank {}: fault: waiting {} s {} (in wait_in_user_code, user_code.cpp:{})", rank,
                 seconds, where, kSleepLine);
  spdlog::default_logger()->flush();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}
