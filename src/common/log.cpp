#include "ddp/common/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <array>

namespace ddp::log {

bool is_valid_level(const std::string& level) {
  static const std::array<const char*, 6> kLevels = {"trace", "debug", "info",
                                                     "warn",  "error", "off"};
  for (const char* l : kLevels) {
    if (level == l) return true;
  }
  return false;
}

void init(int rank, const std::string& level) {
  // stdout for everything, so a rank's lines keep their order when a launcher prefixes them.
  auto logger = spdlog::get("ddp");
  if (!logger) {
    logger = spdlog::stdout_logger_mt("ddp");
    spdlog::set_default_logger(logger);
  }
  const std::string who = rank < 0 ? std::string("warm spare") : fmt::format("rank {}", rank);
  logger->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [{}] [%l] %v", who));
  auto lvl = spdlog::level::from_str(is_valid_level(level) ? level : "info");
  if (rank != 0 && lvl < spdlog::level::warn) lvl = spdlog::level::warn;
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::info);
}

}  // namespace ddp::log
