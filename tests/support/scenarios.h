#pragma once
// Several scenarios in one launch of ranks. A test that checks what happens inside a process group
// (not at a process boundary: an exit, a kill, a timeout) need not start its own ranks: a worker
// runs the scenarios of several tests in turn on one group, each scenario's lines prefixed with
// "[NAME] " and ended by "[NAME] rank R: exit K", and each test reads its own scenario's lines back
// (scenario_lines) and asserts on them what it asserted on a launch of its own. A failing scenario
// is named by its test, and hides no other: the next scenarios still run, unless it threw (the
// group may then be unusable), in which case they say "[NAME] not run" and their tests fail too.
//
// This is the test side (the standard library only); the workers' is scenario_runner.h.

#include <map>
#include <sstream>
#include <string>
#include <utility>

namespace ddp::testing {

// The lines of `output` that start with "[scenario] ", without it: what one scenario printed.
inline std::string scenario_lines(const std::string& output, const std::string& scenario) {
  const std::string prefix = "[" + scenario + "] ";
  std::istringstream in(output);
  std::string line, lines;
  while (std::getline(in, line)) {
    // A launcher may put its own prefix before the worker's ("[rank 1] [sgd] ..." ).
    const size_t at = line.find(prefix);
    if (at != std::string::npos) lines += line.substr(at + prefix.size()) + "\n";
  }
  return lines;
}

// `scenario`'s lines in `output`, or, where it printed none (its launch ended before it), the whole
// output: a failing test's message.
inline std::string scenario_message(const std::string& output, const std::string& scenario) {
  const std::string lines = scenario_lines(output, scenario);
  return lines.empty() ? "no line of [" + scenario + "] in:\n" + output : lines;
}

// `launch(world)`'s result, made by the first call of the process for that world size: the tests of
// one ctest test (tests/CMakeLists.txt's SHARED) share one launch per world size. Each `launch`
// (each lambda's type) has its own.
template <class Launch>
const auto& once_per_world(int world, Launch launch) {
  static std::map<int, decltype(launch(world))> made;
  auto it = made.find(world);
  if (it == made.end()) it = made.emplace(world, launch(world)).first;
  return it->second;
}

// The words after "NAME=" in "NAME=ARG", or "" (the scenario's argument: a file).
inline std::pair<std::string, std::string> scenario_name_and_argument(const std::string& word) {
  const size_t eq = word.find('=');
  if (eq == std::string::npos) return {word, ""};
  return {word.substr(0, eq), word.substr(eq + 1)};
}

}  // namespace ddp::testing
