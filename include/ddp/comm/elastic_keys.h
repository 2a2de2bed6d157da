#pragma once
// The keys and values of elastic membership, shared by the launcher (which never links LibTorch)
// and its workers (elastic.h).
//
// Note [Elastic membership]
// The launcher is the arbiter: it knows which workers are alive (it reaps them). It publishes
// generation g as the key elastic/gen/<g> (the member ids, comma-separated, in rank order) and
// then elastic/latest = g. A generation is a new gloo group over its own store prefix, never a
// repaired one. The members of g vote after every step's gradients are reduced and before the
// optimizer applies them (round r: add 1 to elastic/gen/<g>/votes, which round r completes at
// r x members); the one whose vote completes the count writes the decision, and a member that
// failed, or one that finds elastic/gen/<g>/abort (the launcher's notice of a member's death,
// naming it: "rank 1 of generation 0, worker 1.0 (local rank 1, pid 42, host h): signal SIGKILL
// (9)"), writes "abort": the decision key is written by compare-and-set, so whoever writes first
// decides for all. A step is applied by
// every member or by none. After an abort, or a decision to grow (a joiner announced
// elastic/ready/<id>, and the launcher set elastic/gen/<g>/grow), the members ask for the next
// generation (elastic/gen/<g>/reform) and the launcher publishes it: the living members, in their
// order, then the ready joiners.

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::comm {

// "a,b,c" -> {a, b, c}, and back. Pure functions.
std::vector<std::string> parse_members(const std::string& text);
std::string format_members(const std::vector<std::string>& members);

enum class StepDecision { kCommit, kCommitAndGrow, kAbort };
const char* to_string(StepDecision decision);
StepDecision parse_decision(const std::string& text);  // throws Error for anything else

// The keys of the protocol, in one place for both sides.
struct ElasticKeys {
  static std::string generation(int64_t g);  // elastic/gen/<g>
  static std::string latest();               // elastic/latest
  static std::string votes(int64_t g);  // the generation's count of votes, all rounds
  static std::string decision(int64_t g, int64_t round);
  static std::string abort(int64_t g);
  static std::string reform(int64_t g);
  static std::string grow(int64_t g);
  static std::string ready(const std::string& id);
};

}  // namespace ddp::comm
