#pragma once
// The keys and values of elastic membership, shared by the launcher (which never links LibTorch)
// and its workers (elastic.h).
//
// Note [Elastic membership]
// The launcher is the arbiter (launch/arbiter.h): it knows which workers are alive (it reaps
// them). It publishes generation g as the key elastic/gen/<g> (the member ids, comma-separated,
// in rank order) and then elastic/latest = g. A generation is a new gloo (or nccl) group over its
// own store prefix, never a repaired one. The members of g vote after every step's gradients are
// reduced and before the optimizer applies them (round r: add 1 to elastic/gen/<g>/votes, which
// round r completes at r x members); the one whose vote completes the count writes the decision,
// and a member that failed, or one that finds elastic/gen/<g>/abort, writes "abort": the decision
// key is written by compare-and-set, so whoever writes first decides for all (when each member
// takes the decision: Note [A step's vote travels during the next step]). A member whose decision
// is late (20 ms) writes elastic/gen/<g>/voted/<rank> = r; one that does not come within the vote
// timeout (the collective timeout) is "abort", and the warning names the members whose voted key
// lags: those that never voted.
// elastic/gen/<g>/abort is the notice that g is given up: the launcher's when a member died
// ("rank 1 of generation 0, worker 1.0 (local rank 1, pid 42, host h): signal SIGKILL (9)"), or
// the first member's that failed without dying ("rank 1 of generation 0, worker 1.0: step 6
// dropped"), by compare-and-set; it ends every wait of the others on g (the store's, and an nccl
// communicator's, which is aborted). After an abort, or a decision to grow (a joiner announced
// elastic/ready/<id>, and the launcher set elastic/gen/<g>/grow), the members ask for the next
// generation (elastic/gen/<g>/reform, each counted in elastic/gen/<g>/reform_count) and the
// launcher publishes it: the living members, in
// their order, then the ready joiners (also when the next generation follows a loss). A member
// joins the newest generation that includes it and is not given up.
//
// What workers say of themselves, for the launcher's decisions: elastic/speaks/<id> (the agent
// connected: the program takes part, so a lost worker is restarted alone), elastic/holds/<id> (a
// joiner's heal passed: it holds the group's committed state, Note [Committed state has an
// owner] in launch/arbiter.h), elastic/trained/<id> (it left its training loop: Note [Every ending
// is decided] there), elastic/checkpoint (the newest checkpoint rank 0 wrote). When no
// member holds the state any more, the launcher starts every worker again from that checkpoint:
// elastic/round = r tells the other nodes, and elastic/round/<r>/port is the round's MASTER_PORT.
//
// Note [A step's vote travels during the next step]
// A member votes on step s once its gradients are reduced, but does not wait for the decision: it
// applies the step, and takes the decision when step s+1's gradients are reduced (or at the
// epoch's end, before its collectives). Waiting put about three store round trips on every step
// (10-13 % of a 9 ms step, 3 ranks on 2 cores); now the vote runs on a thread of its own beside
// the next step's forward and backward. It is safe because a reduction that completed on a
// member holds every member's gradients: no member applies a step that not all contributed to.
// After a failure the members may differ by that one step (one's reduction completed, another's
// did not), and every member of the next generation takes the newest state a member holds (the
// heal: Note [One state transfer per change] in ddp/train/elastic_member.h), so all go on from
// that member's last step, which the log names. The decision says when to re-form: "abort" (a
// member failed in step s, or left) ends the generation within step s+1; "grow" re-forms it after
// step s+1 (every member reads the same decision at the same step). A member that leaves its
// generation first decides its open round "abort", so that no vote waits for one that will
// never come.
//
// Note [Elastic nodes]
// With several nodes (--nnodes MIN:MAX, MAX > 1) node 0's launcher serves the store and is the
// arbiter; each other launcher reports to it through the store and beats: elastic/node/<n>/beat,
// a counter it adds to every monitor interval. A node registers by an event (below) naming its
// workers and starts them once the arbiter's answer elastic/node/<n>/admitted says whether they
// are in the first generation ("initial") or join a running group ("join"). Events are a log: a
// launcher adds 1 to elastic/events and writes its event under the number it got,
// elastic/event/<k>; the arbiter reads them in order: "node <n> <ids>", "join <n> <id>" (a
// restarted worker), "lost <n> <id> <what>", "done <n> <id>" (exit 0). A node whose beat stands
// still for --node-timeout is lost with all its workers (its launcher, which could not beat
// either, kills them: they are out of the group), and joins again when its link is back: its
// beats resume and its restarted workers join. When the arbiter starts every worker again
// (round r), each launcher stops its workers, starts new ones and registers them again
// (admitted per round: elastic/node/<n>/admitted/<r>). The job ends when every member is done:
// the arbiter writes elastic/finished, and each launcher, having read it, writes
// elastic/node/<n>/bye.

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
  static std::string votes(int64_t g);       // the generation's count of votes, all rounds
  static std::string decision(int64_t g, int64_t round);
  static std::string abort(int64_t g);
  static std::string reform(int64_t g);
  static std::string reform_count(int64_t g);  // how many of g's members asked
  static std::string grow(int64_t g);
  static std::string voted(int64_t g, int rank);  // the last round `rank` of g voted on
  static std::string ready(const std::string& id);
  // What a worker says of itself: it speaks this protocol (its agent connected), it holds the
  // group's committed state (Note [Committed state has an owner] in launch/arbiter.h).
  static std::string speaks(const std::string& id);
  static std::string holds(const std::string& id);
  // It left its training loop: it takes part in no generation after its last (Note [Every
  // ending is decided] in launch/arbiter.h).
  static std::string trained(const std::string& id);
  static std::string trained_count();  // how many said so: the launcher scans only when it grew
  static std::string checkpoint();     // the newest checkpoint the group wrote: which
  // Group restarts: the round every node's workers belong to (absent: 0), and the rendezvous port
  // of a round's workers (their MASTER_PORT).
  static std::string round();
  static std::string worker_port(int round);
  // Several nodes (Note [Elastic nodes]).
  static std::string events();          // the count of events
  static std::string event(int64_t k);  // the k-th, from 1
  static std::string admitted(int node, int round);
  static std::string beat(int node);
  static std::string bye(int node);
  static std::string finished();
};

// An event of a node's launcher (Note [Elastic nodes]), and its text. Pure functions.
struct NodeEvent {
  enum class Kind { kNode, kJoin, kLost, kDone };
  Kind kind = Kind::kNode;
  int node = 0;
  std::string ids;   // kNode: the node's worker ids, comma-separated; else one id
  std::string what;  // kLost: who and how
};
std::string format_event(const NodeEvent& event);
NodeEvent parse_event(const std::string& text);  // throws Error for anything else

}  // namespace ddp::comm
