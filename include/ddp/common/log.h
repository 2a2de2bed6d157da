#pragma once
// Rank-aware logging on spdlog. Rank 0 logs at the configured level; other ranks log only
// warnings and errors, so a run prints one story, yet every rank can still report its failure.
// Logging never throws: spdlog reports its own formatting errors and carries on.

#include <spdlog/spdlog.h>

#include <string>

namespace ddp::log {

// Sets the pattern "[time] [rank r] [level] message" and the level. Safe to call again
// (e.g. once the rank is known); a rank below 0 is the launcher's warm spare, which is no rank
// ("[warm spare]"). `level` is one of trace, debug, info, warn, error, off.
void init(int rank, const std::string& level);

// True for the names init() accepts.
bool is_valid_level(const std::string& level);

using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::trace;
using spdlog::warn;

}  // namespace ddp::log
