#pragma once
// The worker side of several scenarios in one launch of ranks (scenarios.h says why and how).

#include <exception>
#include <functional>
#include <iostream>
#include <streambuf>
#include <string>
#include <utility>
#include <vector>

#include "ddp/common/error.h"
#include "scenarios.h"

namespace ddp::testing {

// Prefixes every line written to `out` with `prefix` while it lives.
class PrefixedLines : public std::streambuf {
 public:
  PrefixedLines(std::ostream& out, std::string prefix)
      : out_(out), target_(out.rdbuf()), prefix_(std::move(prefix)) {
    out_.rdbuf(this);
  }
  ~PrefixedLines() override {
    if (!at_line_start_) overflow('\n');
    out_.rdbuf(target_);
  }
  PrefixedLines(const PrefixedLines&) = delete;
  PrefixedLines& operator=(const PrefixedLines&) = delete;

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    if (at_line_start_) target_->sputn(prefix_.data(), static_cast<std::streamsize>(prefix_.size()));
    at_line_start_ = c == '\n';
    return target_->sputc(static_cast<char>(c));
  }
  int sync() override { return target_->pubsync(); }

 private:
  std::ostream& out_;
  std::streambuf* target_;
  std::string prefix_;
  bool at_line_start_ = true;
};

// Runs `scenarios` ("NAME" or "NAME=ARG") in order through `run(name, argument)`, whose return is
// the scenario's exit code (a ddp::Error it throws: the error's), with `between()` (a barrier of
// the group) after each. Every line the scenario prints to std::cout is prefixed "[NAME] ", and it
// ends with "[NAME] rank R: exit K". A scenario that threw on every rank alike leaves the group
// usable, and the next runs; where the barrier after it fails (a rank threw in the middle of a
// collective the others still wait in), the rest say "not run". Returns 0 when every scenario
// returned 0, else the first failure's code.
inline int run_scenarios(const std::vector<std::string>& scenarios, int rank,
                         const std::function<int(const std::string&, const std::string&)>& run,
                         const std::function<void()>& between) {
  int status = 0;
  bool broken = false;
  for (const auto& word : scenarios) {
    const auto [name, argument] = scenario_name_and_argument(word);
    PrefixedLines lines(std::cout, "[" + name + "] ");
    if (broken) {
      std::cout << "not run: an earlier scenario left the group unusable" << std::endl;
      continue;
    }
    int code = 0;
    try {
      code = run(name, argument);
    } catch (const ddp::Error& e) {
      std::cout << "error: " << e.what() << "\n";
      code = e.exit_code();
    } catch (const std::exception& e) {
      std::cout << "exception: " << e.what() << "\n";
      code = 5;
    }
    try {
      between();
    } catch (const std::exception& e) {
      std::cout << "the group is unusable after this scenario: " << e.what() << "\n";
      broken = true;
    }
    std::cout << "rank " << rank << ": exit " << code << std::endl;
    if (status == 0) status = code;
  }
  return status;
}

}  // namespace ddp::testing
