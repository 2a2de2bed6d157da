#include "ddp/common/error.h"

#include <fmt/format.h>

namespace ddp {

void throw_check_failure(const char* file, int line, const char* expr, const std::string& message) {
  throw Error(fmt::format("{}:{}: check '{}' failed: {}", file, line, expr, message));
}

}  // namespace ddp
