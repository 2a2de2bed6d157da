#pragma once
// LibTorch's errors as one line for our messages: c10::Error::what() carries a C++ stack trace,
// and its message can run over several lines; the first line says what went wrong.

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace ddp::train {

inline std::string first_line_of(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10 ? c10->msg() : e.what();
  return text.substr(0, text.find('\n'));
}

}  // namespace ddp::train
