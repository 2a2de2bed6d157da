// The launcher's arbiter of elastic membership (launch/arbiter.h) as a state machine: its
// decisions on losses, joins, stranded joiners, everyone lost, below MIN, every order of the
// workers' endings, losses close together, with no process, store or clock (each event is told at
// a time of the test's choosing); and the workers' ids (launch/worker_id.h).
#include <gtest/gtest.h>

#include <initializer_list>
#include <optional>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "arbiter.h"
#include "ddp/common/error.h"
#include "worker_id.h"

namespace ddp::launch {
// gtest names an id by its text.
void PrintTo(const WorkerId& id, std::ostream* out) {
  *out << id.to_string();
}
}  // namespace ddp::launch

// Named: the unit tests are compiled as one unity source, whose other files have names of their
// own.
namespace arbiter_test {

using ddp::launch::Arbiter;
using ddp::launch::ArbiterAction;
using ddp::launch::ArbiterEvent;
using ddp::launch::Clock;
using ddp::launch::WorkerId;
namespace action = ddp::launch::action;
namespace event = ddp::launch::event;
using std::chrono::milliseconds;
using std::chrono::seconds;

const Clock::time_point kStart{};  // the machine's clock is the test's own

// A worker id written as the launcher writes it: id("1.0").
WorkerId id(const char* text) {
  const auto parsed = WorkerId::parse(text);
  EXPECT_TRUE(parsed.has_value()) << text;
  return parsed.value_or(WorkerId{});
}

// Worker ids written as the launcher writes them: Ids{"0.0", "1.0"}.
struct Ids : std::vector<WorkerId> {
  Ids(std::initializer_list<const char*> texts) {
    for (const char* text : texts) push_back(id(text));
  }
};

// An arbiter of one node (or `max_nodes`), told events at times of the test's choosing.
class Job {
 public:
  explicit Job(int max_restarts = 2, int min_nodes = 1, int max_nodes = 1) {
    Arbiter::Settings s;
    s.min_nodes = min_nodes;
    s.max_nodes = max_nodes;
    s.node_timeout = seconds(15);
    s.max_restarts = max_restarts;
    arbiter_.emplace(s, kStart);
  }
  Arbiter& arbiter() { return *arbiter_; }
  Clock::time_point now() const { return now_; }
  void pass(Clock::duration d) { now_ += d; }

  std::vector<ArbiterAction> on(const ArbiterEvent& e) { return arbiter_->on(e, now_); }
  std::vector<ArbiterAction> lose(const Ids& ids, const std::string& what, int exit_code = 137) {
    return on(event::Lost{ids, what, exit_code});
  }
  std::vector<ArbiterAction> tick() { return on(event::Tick{}); }
  // Past the loss window (Note [Losses close together are one decision]): the restarts it held.
  std::vector<ArbiterAction> after_loss_window() {
    pass(milliseconds(500));
    return tick();
  }
  void checkpoint(const std::string& which = "out/checkpoint-epoch-0001.pt (after epoch 1)") {
    on(event::Checkpoint{which});
  }
  // A job of ddp_train --elastic workers `ids` on node 0, formed: generation 0 published.
  void start(const Ids& ids) {
    on(event::NodeIn{0, ids});
    on(event::Speaks{});
    tick();
  }

 private:
  std::optional<Arbiter> arbiter_;
  Clock::time_point now_ = kStart;
};

// The actions of type `A` among `actions`.
template <class A>
std::vector<A> of(const std::vector<ArbiterAction>& actions) {
  std::vector<A> out;
  for (const auto& a : actions) {
    if (const A* found = std::get_if<A>(&a)) out.push_back(*found);
  }
  return out;
}

TEST(Arbiter, OneNodeFormsItsFirstGenerationOnceItsWorkersAreIn) {
  Job job;
  EXPECT_TRUE(job.tick().empty());  // no worker yet
  job.on(event::NodeIn{0, Ids{"0.0", "1.0", "2.0"}});
  const auto published = of<action::Publish>(job.tick());
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].generation, 0);
  EXPECT_EQ(published[0].members, (Ids{"0.0", "1.0", "2.0"}));
  EXPECT_EQ(job.arbiter().phase(), Arbiter::Phase::kRunning);
  EXPECT_TRUE(job.arbiter().not_known_holders().empty());  // the first generation holds the state
}

// A member lost: its generation's step is aborted (the notice names it), the next generation is
// published at once without it, and its next incarnation is started to join when the loss window
// closes.
TEST(Arbiter, ALostMemberIsLeftOutAtOnceAndRestartedToJoin) {
  Job job;
  job.start({"0.0", "1.0", "2.0"});
  const auto actions = job.lose({"1.0"}, "worker 1.0: signal SIGKILL (9)");
  const auto notice = of<action::AbortNotice>(actions);
  ASSERT_EQ(notice.size(), 1u);
  EXPECT_EQ(notice[0].generation, 0);
  EXPECT_EQ(notice[0].text, "rank 1 of generation 0, worker 1.0: signal SIGKILL (9)");
  const auto published = of<action::Publish>(actions);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].generation, 1);
  EXPECT_EQ(published[0].members, (Ids{"0.0", "2.0"}));
  // Restarted once the loss window closes: workers killed together are one decision.
  EXPECT_TRUE(of<action::RestartWorker>(actions).empty());
  job.pass(milliseconds(499));
  EXPECT_TRUE(of<action::RestartWorker>(job.tick()).empty());
  job.pass(milliseconds(1));
  const auto restart = of<action::RestartWorker>(job.tick());
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_EQ(restart[0].worker, id("1.1"));
  EXPECT_EQ(job.arbiter().joining(), Ids{"1.1"});

  // Ready: the members take it in after their next step (the vote's "grow"), when they ask for the
  // next generation: granted 100 ms after the request is seen while a member has not asked (it may
  // be dying, to be left out), at once when both have (Note [A request every member made is
  // granted at once]).
  const auto grow = of<action::Grow>(job.on(event::Ready{id("1.1")}));
  ASSERT_EQ(grow.size(), 1u);
  EXPECT_EQ(grow[0].generation, 1);
  job.on(event::Reform{1});
  EXPECT_TRUE(of<action::Publish>(job.tick()).empty());
  job.pass(milliseconds(10));
  job.on(event::Reform{2});
  const auto grown = of<action::Publish>(job.tick());
  ASSERT_EQ(grown.size(), 1u);
  EXPECT_EQ(grown[0].members, (Ids{"0.0", "2.0", "1.1"}));
  EXPECT_EQ(job.arbiter().not_known_holders(), Ids{"1.1"});  // until its heal passes
}

// A joiner that is ready when a member dies is taken into the generation that loss publishes:
// the grow it was promised was for the generation given up, and no other would come.
TEST(Arbiter, AReadyJoinerIsTakenIntoTheGenerationALossPublishes) {
  Job job;
  job.start({"0.0", "1.0", "2.0"});
  job.lose({"1.0"}, "worker 1.0: signal SIGKILL (9)");
  job.after_loss_window();
  job.on(event::Ready{id("1.1")});
  const auto published = of<action::Publish>(job.lose({"2.0"}, "worker 2.0: signal SIGKILL (9)"));
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].generation, 2);
  EXPECT_EQ(published[0].members, (Ids{"0.0", "1.1"}));
  job.after_loss_window();
  EXPECT_TRUE(job.arbiter().joining() == Ids{"2.1"});  // 2.0's restart, not ready yet
}

// Generation 2: worker 0.0, the last holder, and the joiner 1.1, being healed.
void take_in_a_joiner(Job& job) {
  job.start({"0.0", "1.0"});
  job.lose({"1.0"}, "worker 1.0: signal SIGKILL (9)");
  job.after_loss_window();
  job.on(event::Ready{id("1.1")});
  job.on(event::Reform{});
  job.pass(milliseconds(100));
  job.tick();
}

// The last member holding the group's state lost while a joiner is taken in: the joiner asks for
// the next generation without having said it holds the state (Note [A joiner's word on the
// state]), so the job goes back to its newest checkpoint, every worker started again.
TEST(Arbiter, TheLastHolderLostWhileAJoinerIsTakenInGoesBackToTheCheckpoint) {
  Job job(/*max_restarts=*/3);
  take_in_a_joiner(job);
  job.checkpoint("out/checkpoint-epoch-0002.pt (after epoch 2)");
  const auto lost = job.lose({"0.0"}, "worker 0.0: signal SIGKILL (9)");
  EXPECT_TRUE(of<action::Publish>(lost).empty()) << "a generation of a joiner only";
  EXPECT_EQ(of<action::AbortNotice>(lost).size(), 1u);  // the joiner's waits end
  EXPECT_TRUE(of<action::RestartGroup>(lost).empty()) << "the joiner's word first";
  job.on(event::Reform{1});  // every member asked, but one not known to hold the state
  EXPECT_TRUE(of<action::RestartGroup>(job.tick()).empty());
  job.pass(milliseconds(100));  // the reform delay: a holder says so before it asks
  const auto actions = job.tick();
  EXPECT_TRUE(of<action::Publish>(actions).empty()) << "a generation of a joiner only";
  const auto restart = of<action::RestartGroup>(actions);
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_EQ(restart[0].round, 1);
  EXPECT_NE(restart[0].why.find("no worker holding the group's trained state is left"),
            std::string::npos);
  EXPECT_NE(restart[0].why.find("out/checkpoint-epoch-0002.pt"), std::string::npos);
  EXPECT_EQ(job.arbiter().restarts(), 2);  // 1.1, then the group
  // Round 1: the fresh workers form the first generation; they hold the state again (resumed).
  job.on(event::NodeIn{0, Ids{"0.1", "1.2"}});
  const auto published = of<action::Publish>(job.tick());
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].generation, 3);
  EXPECT_EQ(published[0].members, (Ids{"0.1", "1.2"}));
}

// The last holder lost between the joiner's digest check and its word: the joiner says it holds
// the state a moment later, and goes on as the group (it used to go back to the checkpoint, or
// without one end the job). Without any word, the node timeout ends the wait.
TEST(Arbiter, AJoinerThatSaysItHoldsTheStateAfterTheLastHolderWasLostGoesOn) {
  Job job(/*max_restarts=*/1);
  take_in_a_joiner(job);
  EXPECT_TRUE(job.lose({"0.0"}, "worker 0.0: signal SIGKILL (9)").size() == 1u);  // the notice
  job.pass(seconds(2));
  EXPECT_TRUE(job.tick().empty());
  job.on(event::Holds{id("1.1")});
  const auto published = of<action::Publish>(job.tick());
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].members, Ids{"1.1"});

  Job silent(/*max_restarts=*/1);
  take_in_a_joiner(silent);
  silent.lose({"0.0"}, "worker 0.0: signal SIGKILL (9)");
  silent.pass(seconds(14));
  EXPECT_TRUE(silent.tick().empty());
  silent.pass(seconds(1));
  const auto end = of<action::End>(silent.tick());
  ASSERT_EQ(end.size(), 1u);
  EXPECT_NE(end[0].why.find("generation 2's members did not say they hold it within 15 s"),
            std::string::npos)
      << end[0].why;
}

// A joiner whose heal passed (it said so) holds the state: the old members' loss leaves it going.
TEST(Arbiter, AHealedJoinerHoldsTheStateWhenTheOldMembersAreLost) {
  Job job;
  job.start({"0.0", "1.0"});
  job.lose({"1.0"}, "worker 1.0: signal SIGKILL (9)");
  job.after_loss_window();
  job.on(event::Ready{id("1.1")});
  job.on(event::Reform{});
  job.pass(milliseconds(100));
  job.tick();
  job.on(event::Holds{id("1.1")});
  const auto published = of<action::Publish>(job.lose({"0.0"}, "worker 0.0: signal SIGKILL (9)"));
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].members, Ids{"1.1"});
}

// Every worker lost at once: back to the newest checkpoint, in one restart of the group (not one
// restart per worker); without a checkpoint the job ends, naming what was lost; without a restart
// left it ends too.
TEST(Arbiter, EveryWorkerLostAtOnceGoesBackToTheCheckpointOrEnds) {
  const event::Checkpoint checkpoint{"out/checkpoint-epoch-0001.pt (after epoch 1)"};
  {
    Job job(/*max_restarts=*/1);
    job.start({"0.0", "1.0", "2.0"});
    job.on(checkpoint);
    const auto actions = job.lose({"0.0", "1.0", "2.0"}, "every worker: signal SIGKILL (9)");
    EXPECT_EQ(of<action::RestartGroup>(actions).size(), 1u);
    EXPECT_TRUE(of<action::RestartWorker>(actions).empty());
    EXPECT_EQ(job.arbiter().phase(), Arbiter::Phase::kForming);
  }
  {
    Job job;
    job.start({"0.0", "1.0", "2.0"});
    const auto end = of<action::End>(job.lose({"0.0", "1.0", "2.0"}, "three SIGKILLs", 137));
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, 137);
    EXPECT_NE(end[0].why.find("(lost: three SIGKILLs); the group wrote no checkpoint"),
              std::string::npos)
        << end[0].why;
    EXPECT_EQ(job.arbiter().phase(), Arbiter::Phase::kEnded);
    EXPECT_TRUE(job.tick().empty());  // ended: nothing more happens
  }
  {
    Job job(/*max_restarts=*/0);
    job.start({"0.0", "1.0"});
    job.on(checkpoint);
    const auto end = of<action::End>(job.lose({"0.0", "1.0"}, "two SIGKILLs"));
    ASSERT_EQ(end.size(), 1u);
    EXPECT_NE(end[0].why.find("no restart left (--max-restarts 0)"), std::string::npos);
  }
}

// Losses one after another (the supervisor reaps them apart): each survivor generation is
// published while a holder is left, and a worker is restarted while restarts last.
TEST(Arbiter, RestartsStopAtTheBudgetAndTheSurvivorsGoOn) {
  Job job(/*max_restarts=*/1);
  job.start({"0.0", "1.0", "2.0"});
  job.lose({"0.0"}, "a");
  EXPECT_EQ(of<action::RestartWorker>(job.after_loss_window()).size(), 1u);
  const auto second = job.lose({"1.0"}, "b");
  EXPECT_TRUE(of<action::RestartWorker>(job.after_loss_window()).empty());
  ASSERT_EQ(of<action::Publish>(second).size(), 1u);
  EXPECT_EQ(of<action::Publish>(second)[0].members, Ids{"2.0"});
  // The members finish: the job is done, whatever joiner still waits.
  const auto end = of<action::End>(job.on(event::Done{Ids{"2.0"}}));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 0);
}

// A program that never said it speaks the protocol (any program but ddp_train --elastic) is
// restarted whole on any failure, as torchrun's elastic agent does; with no restart left the job
// ends with the failed worker's exit code.
TEST(Arbiter, AProgramThatDoesNotTakePartIsRestartedWhole) {
  Job job(/*max_restarts=*/1);
  job.on(event::NodeIn{0, Ids{"0.0", "1.0"}});
  job.tick();
  const auto actions = job.lose({"1.0"}, "worker 1.0: exit code 1", 1);
  EXPECT_TRUE(of<action::Publish>(actions).empty());
  EXPECT_EQ(of<action::AbortNotice>(actions).size(), 1u);  // generation 0 is given up
  ASSERT_EQ(of<action::RestartGroup>(actions).size(), 1u);
  EXPECT_NE(of<action::RestartGroup>(actions)[0].why.find("does not take part"), std::string::npos);
  job.on(event::NodeIn{0, Ids{"0.1", "1.1"}});
  job.tick();
  const auto end = of<action::End>(job.lose({"0.1"}, "worker 0.1: exit code 3", 3));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 3);
}

// Several nodes: the first generation waits for MAX nodes, or MIN and the last call; a node
// whose beat stands still for the node timeout is out with its workers; below MIN the job ends.
TEST(Arbiter, NodesJoinBeatAndBelowMinTheJobEnds) {
  Job job(/*max_restarts=*/0, /*min_nodes=*/2, /*max_nodes=*/3);
  job.on(event::NodeIn{0, Ids{"0.0.0", "0.1.0"}});
  job.on(event::Speaks{});
  const auto admit = of<action::Admit>(job.on(event::NodeIn{1, Ids{"1.0.0"}}));
  ASSERT_EQ(admit.size(), 1u);
  EXPECT_FALSE(admit[0].join);
  EXPECT_TRUE(of<action::Publish>(job.tick()).empty());  // MIN in, MAX not: the last call runs
  job.pass(seconds(16));
  ASSERT_EQ(of<action::Publish>(job.tick()).size(), 1u);
  // A late node joins the running group.
  const auto late = of<action::Admit>(job.on(event::NodeIn{2, Ids{"2.0.0"}}));
  ASSERT_EQ(late.size(), 1u);
  EXPECT_TRUE(late[0].join);
  // Node 1 beats, then falls silent: out with its worker after the node timeout.
  for (int n : {1, 2}) job.on(event::Beat{n, 1});
  job.pass(seconds(10));
  job.on(event::Beat{2, 2});
  job.pass(seconds(6));
  const auto dropped = job.tick();
  ASSERT_EQ(of<action::Publish>(dropped).size(), 1u);
  EXPECT_EQ(of<action::Publish>(dropped)[0].members, (Ids{"0.0.0", "0.1.0"}));
  EXPECT_TRUE(of<action::End>(dropped).empty());  // nodes 0 and 2 are in: MIN
  // Node 2 falls silent too: below MIN.
  job.pass(seconds(16));
  const auto end = of<action::End>(job.tick());
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].why, "1 node(s) left in the job, fewer than the 2 of --nnodes 2:3");
}

// A round whose MIN nodes never register ends the job, naming the nodes waited for.
TEST(Arbiter, ARoundWhoseNodesDoNotComeEndsTheJob) {
  Job job(/*max_restarts=*/1, /*min_nodes=*/2, /*max_nodes=*/2);
  job.on(event::NodeIn{0, Ids{"0.0.0"}});
  job.on(event::NodeIn{1, Ids{"1.0.0"}});
  job.on(event::Speaks{});
  job.tick();
  job.checkpoint("c.pt");
  ASSERT_EQ(of<action::RestartGroup>(job.lose({"0.0.0", "1.0.0"}, "both")).size(), 1u);
  job.on(event::NodeIn{0, Ids{"0.0.1"}});  // node 0 started again; node 1 never registers
  job.pass(std::chrono::minutes(5) + seconds(1));
  const auto end = of<action::End>(job.tick());
  ASSERT_EQ(end.size(), 1u);
  EXPECT_NE(end[0].why.find("(waited for node(s) 1)"), std::string::npos) << end[0].why;
}

// Note [Every ending is decided]: a worker that ended 0, or left its training loop, is never a
// member again, and the job ends 0 only once every worker of the last generation ended 0.
TEST(Arbiter, TheJobEndsZeroOnlyWhenEveryWorkerOfTheLastGenerationEndedZero) {
  for (const bool rank0_first : {false, true}) {
    Job job(/*max_restarts=*/0);
    job.start({"0.0", "1.0"});
    job.on(event::Trained{id("0.0")});
    job.on(event::Trained{id("1.0")});
    const Ids first = rank0_first ? Ids{"0.0"} : Ids{"1.0"};
    const Ids last = rank0_first ? Ids{"1.0"} : Ids{"0.0"};
    EXPECT_TRUE(job.on(event::Done{first}).empty()) << "one worker still runs";
    EXPECT_TRUE(job.arbiter().members().empty());
    EXPECT_TRUE(job.after_loss_window().empty());
    const auto end = of<action::End>(job.on(event::Done{last}));
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, 0);
    EXPECT_EQ(end[0].finished, (Ids{"0.0", "1.0"}));
  }
}

// The first order: rank 1 trains to the end and exits 0, then rank 0, also past its
// training loop, exits 3 (its wrapper's last step failed): the job ends 3 at once, naming it.
// (It published a generation of the ended worker 1.0, and waited for it forever.)
TEST(Arbiter, AFailureAfterAnotherWorkerEndedZeroEndsTheJobWithItsCode) {
  Job job(/*max_restarts=*/0);
  job.start({"0.0", "1.0"});
  job.on(event::Trained{id("1.0")});
  job.on(event::Done{Ids{"1.0"}});
  job.on(event::Trained{id("0.0")});
  const auto actions = job.lose({"0.0"}, "worker 0.0 (local rank 0, pid 42): exit code 3", 3);
  EXPECT_TRUE(of<action::Publish>(actions).empty());
  const auto end = of<action::End>(actions);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 3);
  EXPECT_NE(end[0].why.find("rank 0 of generation 0, worker 0.0 (local rank 0, pid 42): exit "
                            "code 3, after it left its training loop"),
            std::string::npos)
      << end[0].why;
  EXPECT_NE(end[0].why.find("the job failed"), std::string::npos) << end[0].why;
}

// The other order: rank 0, past its loop, exits 3 while rank 1 still runs its ending; the job
// ends 3 then, and not 0 when rank 1 ends (it used to: rank 1 was published alone and finished).
// A worker killed in its ending (SIGKILL after its loop) is the same.
TEST(Arbiter, AFailureAfterTheLoopBeforeTheOthersEndedEndsTheJobWithItsCode) {
  for (const int code : {3, 137}) {
    Job job(/*max_restarts=*/0);
    job.start({"0.0", "1.0"});
    job.on(event::Trained{id("0.0")});
    job.on(event::Trained{id("1.0")});
    const auto end = of<action::End>(job.lose({"0.0"}, "worker 0.0: how it ended", code));
    ASSERT_EQ(end.size(), 1u) << code;
    EXPECT_EQ(end[0].exit_code, code);
    EXPECT_EQ(job.arbiter().phase(), Arbiter::Phase::kEnded);
    EXPECT_TRUE(job.on(event::Done{Ids{"1.0"}}).empty());  // ended already, with the failure
  }
}

// A worker killed in the last save (still in its loop: the checkpoint's barrier is the loop's last
// collective) is a loss in training: the survivors, which hold the state, redo the save and end
// 0; its restart, due when the loss window closes, is not needed once they did.
TEST(Arbiter, AWorkerKilledInTheLastSaveIsALossTheOthersFinish) {
  Job job(/*max_restarts=*/1);
  job.start({"0.0", "1.0"});
  const auto published = of<action::Publish>(job.lose({"0.0"}, "worker 0.0: signal SIGKILL (9)"));
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].members, Ids{"1.0"});
  job.on(event::Trained{id("1.0")});
  const auto end = of<action::End>(job.on(event::Done{Ids{"1.0"}}));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 0);
  EXPECT_EQ(end[0].finished, Ids{"1.0"});
  EXPECT_EQ(job.arbiter().restarts(), 0);
}

// With a restart left too: the training is over, a restart would train nothing, and the job
// cannot go on; it ends at once with the failure's code, using no restart.
TEST(Arbiter, WithARestartLeftAFailureAfterTheLoopEndsTheJobToo) {
  Job job(/*max_restarts=*/1);
  job.start({"0.0", "1.0"});
  job.checkpoint();
  job.on(event::Trained{id("1.0")});
  job.on(event::Done{Ids{"1.0"}});
  job.on(event::Trained{id("0.0")});
  const auto actions = job.lose({"0.0"}, "worker 0.0: exit code 3", 3);
  EXPECT_TRUE(of<action::RestartGroup>(actions).empty());
  const auto end = of<action::End>(actions);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 3);
  EXPECT_NE(end[0].why.find("worker 0.0: exit code 3, after it left its training loop: the "
                            "group's training is over"),
            std::string::npos)
      << end[0].why;
  EXPECT_EQ(job.arbiter().restarts(), 0);
}

// A worker out of its loop is never in a new generation: after a collective that completed on
// worker 1.0 only (the last barrier), it ended 0 while the others re-form.
TEST(Arbiter, AWorkerThatLeftItsLoopIsNeverAMemberAgain) {
  Job job;
  job.start({"0.0", "1.0", "2.0"});
  job.on(event::Trained{id("1.0")});
  job.on(event::Reform{});
  job.pass(milliseconds(100));
  const auto published = of<action::Publish>(job.tick());
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].members, (Ids{"0.0", "2.0"}));
  job.on(event::Done{Ids{"1.0"}});
  EXPECT_EQ(of<action::Publish>(job.lose({"2.0"}, "worker 2.0: signal SIGKILL (9)")).at(0).members,
            Ids{"0.0"});
}

// A program that does not speak the protocol (plain ddp_train, a PyTorch script) says nothing of
// its loop: in either order a failure ends the job with its code (no restart) or restarts the
// whole group, and the job never ends 0 with it.
TEST(Arbiter, AProgramThatDoesNotTakePartEndsWithTheFailureInEitherOrder) {
  for (const bool failure_first : {false, true}) {
    Job job(/*max_restarts=*/0);
    job.on(event::NodeIn{0, Ids{"0.0", "1.0"}});
    job.tick();
    if (!failure_first) {
      EXPECT_TRUE(job.on(event::Done{Ids{"1.0"}}).empty());
    }
    const auto end = of<action::End>(job.lose({"0.0"}, "worker 0.0: exit code 3", 3));
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, 3);
    EXPECT_NE(end[0].why.find("rank 0 of generation 0, worker 0.0: exit code 3"), std::string::npos)
        << end[0].why;
  }
}

// Note [Losses close together are one decision]: three workers killed by one `kill`, reaped 40
// ms apart, with 2 restarts: one group restart from the checkpoint, no worker restarted alone
// (it restarted two, then wanted the checkpoint with no restart left: 137).
TEST(Arbiter, LossesWithinTheWindowAreOneDecision) {
  Job job(/*max_restarts=*/2);
  job.start({"0.0", "1.0", "2.0"});
  job.checkpoint();
  std::vector<ArbiterAction> actions;
  for (const char* worker : {"0.0", "1.0", "2.0"}) {
    for (auto& a : job.lose({worker}, std::string("worker ") + worker + ": signal SIGKILL (9)")) {
      actions.push_back(a);
    }
    for (auto& a : job.tick()) actions.push_back(a);
    job.pass(milliseconds(40));
  }
  for (auto& a : job.after_loss_window()) actions.push_back(a);
  EXPECT_TRUE(of<action::RestartWorker>(actions).empty());
  ASSERT_EQ(of<action::RestartGroup>(actions).size(), 1u);
  EXPECT_EQ(job.arbiter().restarts(), 1);
  EXPECT_TRUE(of<action::End>(actions).empty());
  // Losses a window apart are decisions of their own.
  Job apart(/*max_restarts=*/2);
  apart.start({"0.0", "1.0", "2.0"});
  apart.lose({"0.0"}, "a");
  EXPECT_EQ(of<action::RestartWorker>(apart.after_loss_window()).size(), 1u);
  apart.lose({"1.0"}, "b");
  EXPECT_EQ(of<action::RestartWorker>(apart.after_loss_window()).size(), 1u);
}

// The ids' text is the protocol's (store keys, generations, log lines): written and read back
// byte for byte.
TEST(Arbiter, WorkerIdsReadBack) {
  EXPECT_EQ((WorkerId{0, 2, 1}).to_string(), "2.1");
  EXPECT_EQ((WorkerId{1, 2, 3, true}).to_string(), "1.2.3");
  EXPECT_EQ(id("1.2.3").node, 1);
  EXPECT_EQ(id("2.1").node, 0);
  EXPECT_EQ(id("1.2.3").local_rank, 2);
  EXPECT_EQ(id("2.1").local_rank, 2);
  EXPECT_EQ(id("1.2.3").incarnation, 3);
  EXPECT_EQ(id("1.2.3").next_incarnation().to_string(), "1.2.4");
  EXPECT_EQ(id("0.9").next_incarnation().to_string(), "0.10");
  for (const char* text : {"0.0", "2.1", "0.10", "1.2.3", "0.0.0", "12.34.56"}) {
    EXPECT_EQ(id(text).to_string(), text);
  }
  EXPECT_EQ(ddp::launch::to_string(Ids{"0.0.0", "1.1.2"}), "0.0.0,1.1.2");
  EXPECT_EQ(ddp::launch::parse_worker_ids("0.0,1.1"), (Ids{"0.0", "1.1"}));
}

TEST(Arbiter, TextThatIsNoWorkerIdIsRefused) {
  for (const char* text : {"", "1", "1.", ".1", "1..2", "1.2.3.4", "-1.0", "+1.0", "a.0", "1.0 ",
                           " 1.0", "01.0", "1.2,3", "99999999999.0"}) {
    EXPECT_FALSE(WorkerId::parse(text).has_value()) << "'" << text << "'";
  }
  try {
    ddp::launch::parse_worker_ids("0.0,x.1");
    FAIL() << "expected an error";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'x.1' in '0.0,x.1' is not a worker id"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace arbiter_test
