#pragma once
// The message of the InputError a piece of code throws, for tests of bad input. Header-only.

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "ddp/common/error.h"

namespace ddp::testing {

// The message of the InputError `f` throws; "" and a test failure when it throws none.
inline std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

}  // namespace ddp::testing
