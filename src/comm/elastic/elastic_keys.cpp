#include "ddp/comm/elastic/elastic_keys.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp::comm {

std::vector<std::string> parse_members(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string id; std::getline(in, id, ',');) {
    if (!id.empty()) out.push_back(id);
  }
  return out;
}

std::string format_members(const std::vector<std::string>& members) {
  return fmt::format("{}", fmt::join(members, ","));
}

const char* to_string(StepDecision decision) {
  switch (decision) {
    case StepDecision::kCommit:
      return "commit";
    case StepDecision::kCommitAndGrow:
      return "commit grow";
    case StepDecision::kAbort:
      return "abort";
  }
  return "?";
}

StepDecision parse_decision(const std::string& text) {
  for (auto d : {StepDecision::kCommit, StepDecision::kCommitAndGrow, StepDecision::kAbort}) {
    if (text == to_string(d)) return d;
  }
  throw Error(fmt::format("elastic: unknown step decision '{}'", text));
}

std::string ElasticKeys::generation(int64_t g) {
  return fmt::format("elastic/gen/{}", g);
}
std::string ElasticKeys::latest() {
  return "elastic/latest";
}
std::string ElasticKeys::votes(int64_t g) {
  return fmt::format("elastic/gen/{}/votes", g);
}
std::string ElasticKeys::decision(int64_t g, int64_t round) {
  return fmt::format("elastic/gen/{}/decide/{}", g, round);
}
std::string ElasticKeys::abort(int64_t g) {
  return fmt::format("elastic/gen/{}/abort", g);
}
std::string ElasticKeys::reform(int64_t g) {
  return fmt::format("elastic/gen/{}/reform", g);
}
std::string ElasticKeys::reform_count(int64_t g) {
  return fmt::format("elastic/gen/{}/reform_count", g);
}
std::string ElasticKeys::grow(int64_t g) {
  return fmt::format("elastic/gen/{}/grow", g);
}
std::string ElasticKeys::voted(int64_t g, int rank) {
  return fmt::format("elastic/gen/{}/voted/{}", g, rank);
}
std::string ElasticKeys::ready(const std::string& id) {
  return "elastic/ready/" + id;
}
std::string ElasticKeys::speaks(const std::string& id) {
  return "elastic/speaks/" + id;
}
std::string ElasticKeys::holds(const std::string& id) {
  return "elastic/holds/" + id;
}
std::string ElasticKeys::trained(const std::string& id) {
  return "elastic/trained/" + id;
}
std::string ElasticKeys::trained_count() {
  return "elastic/trained_count";
}
std::string ElasticKeys::checkpoint() {
  return "elastic/checkpoint";
}
std::string ElasticKeys::round() {
  return "elastic/round";
}
std::string ElasticKeys::worker_port(int round) {
  return fmt::format("elastic/round/{}/port", round);
}
std::string ElasticKeys::events() {
  return "elastic/events";
}
std::string ElasticKeys::event(int64_t k) {
  return fmt::format("elastic/event/{}", k);
}
std::string ElasticKeys::admitted(int node, int round) {
  return fmt::format("elastic/node/{}/admitted/{}", node, round);
}
std::string ElasticKeys::beat(int node) {
  return fmt::format("elastic/node/{}/beat", node);
}
std::string ElasticKeys::bye(int node) {
  return fmt::format("elastic/node/{}/bye", node);
}
std::string ElasticKeys::finished() {
  return "elastic/finished";
}

namespace {
constexpr const char* kEventWords[] = {"node", "join", "lost", "done"};
}  // namespace

std::string format_event(const NodeEvent& e) {
  std::string text = fmt::format("{} {} {}", kEventWords[static_cast<int>(e.kind)], e.node, e.ids);
  if (e.kind == NodeEvent::Kind::kLost) text += " " + e.what;
  return text;
}

NodeEvent parse_event(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  NodeEvent e;
  if (!(in >> word >> e.node >> e.ids) || e.node < 0) {
    throw Error(fmt::format("elastic: malformed event '{}'", text));
  }
  const auto* found = std::find(std::begin(kEventWords), std::end(kEventWords), word);
  if (found == std::end(kEventWords)) throw Error(fmt::format("elastic: unknown event '{}'", text));
  e.kind = static_cast<NodeEvent::Kind>(found - std::begin(kEventWords));
  std::getline(in >> std::ws, e.what);
  return e;
}

}  // namespace ddp::comm
