// The launcher's arbiter of elastic membership (launch/arbiter.h) as a state machine: its
// decisions on losses, joins, stranded joiners, everyone lost, below MIN, every order of the
// workers' endings, losses close together, with no process, store or clock (each event carries its
// time).
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "arbiter.h"

// Named: the unit tests are compiled as one unity source, whose other files have a Kind of their
// own.
namespace arbiter_test {

using ddp::launch::Arbiter;
using ddp::launch::ArbiterAction;
using ddp::launch::ArbiterEvent;
using ddp::launch::Clock;
using Do = ArbiterAction::Kind;
using Kind = ArbiterEvent::Kind;
using Ids = std::vector<std::string>;
using std::chrono::milliseconds;
using std::chrono::seconds;

const Clock::time_point kStart{};  // the machine's clock is the events' own

// An arbiter of one node (or `max_nodes`), fed events at times of the test's choosing.
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

  std::vector<ArbiterAction> on(Kind kind, Ids ids = {}, int node = 0) {
    ArbiterEvent e;
    e.kind = kind;
    e.ids = std::move(ids);
    e.node = node;
    e.now = now_;
    return arbiter_->on(e);
  }
  std::vector<ArbiterAction> lose(Ids ids, const std::string& what, int exit_code = 137) {
    ArbiterEvent e;
    e.kind = Kind::kLost;
    e.ids = std::move(ids);
    e.what = what;
    e.exit_code = exit_code;
    e.now = now_;
    return arbiter_->on(e);
  }
  std::vector<ArbiterAction> tick() { return on(Kind::kTick); }
  // Past the loss window (Note [Losses close together are one decision]): the restarts it held.
  std::vector<ArbiterAction> after_loss_window() {
    pass(milliseconds(500));
    return tick();
  }
  void checkpoint(const std::string& which = "out/checkpoint-epoch-0001.pt (after epoch 1)") {
    ArbiterEvent e;
    e.kind = Kind::kCheckpoint;
    e.what = which;
    e.now = now_;
    arbiter_->on(e);
  }
  // A job of ddp_train --elastic workers `ids` on node 0, formed: generation 0 published.
  void start(const Ids& ids) {
    on(Kind::kNode, ids);
    on(Kind::kSpeaks, {ids.front()});
    tick();
  }

 private:
  std::optional<Arbiter> arbiter_;
  Clock::time_point now_ = kStart;
};

// The actions of `kind` among `actions`.
std::vector<ArbiterAction> of(const std::vector<ArbiterAction>& actions, Do kind) {
  std::vector<ArbiterAction> out;
  std::copy_if(actions.begin(), actions.end(), std::back_inserter(out),
               [&](const ArbiterAction& a) { return a.kind == kind; });
  return out;
}

TEST(Arbiter, OneNodeFormsItsFirstGenerationOnceItsWorkersAreIn) {
  Job job;
  EXPECT_TRUE(job.tick().empty());  // no worker yet
  job.on(Kind::kNode, {"0.0", "1.0", "2.0"});
  const auto published = of(job.tick(), Do::kPublish);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].generation, 0);
  EXPECT_EQ(published[0].ids, (Ids{"0.0", "1.0", "2.0"}));
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
  const auto notice = of(actions, Do::kAbortNotice);
  ASSERT_EQ(notice.size(), 1u);
  EXPECT_EQ(notice[0].generation, 0);
  EXPECT_EQ(notice[0].text, "rank 1 of generation 0, worker 1.0: signal SIGKILL (9)");
  const auto published = of(actions, Do::kPublish);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].generation, 1);
  EXPECT_EQ(published[0].ids, (Ids{"0.0", "2.0"}));
  // Restarted once the loss window closes: workers killed together are one decision.
  EXPECT_TRUE(of(actions, Do::kRestartWorker).empty());
  job.pass(milliseconds(499));
  EXPECT_TRUE(of(job.tick(), Do::kRestartWorker).empty());
  job.pass(milliseconds(1));
  const auto restart = of(job.tick(), Do::kRestartWorker);
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_EQ(restart[0].ids, Ids{"1.1"});
  EXPECT_EQ(job.arbiter().joining(), Ids{"1.1"});

  // Ready: the members take it in after their next step (the vote's "grow"), when they ask for the
  // next generation, granted 100 ms after the request is seen.
  const auto grow = of(job.on(Kind::kReady, {"1.1"}), Do::kGrow);
  ASSERT_EQ(grow.size(), 1u);
  EXPECT_EQ(grow[0].generation, 1);
  job.on(Kind::kReform);
  EXPECT_TRUE(of(job.tick(), Do::kPublish).empty());
  job.pass(milliseconds(100));
  const auto grown = of(job.tick(), Do::kPublish);
  ASSERT_EQ(grown.size(), 1u);
  EXPECT_EQ(grown[0].ids, (Ids{"0.0", "2.0", "1.1"}));
  EXPECT_EQ(job.arbiter().not_known_holders(), Ids{"1.1"});  // until its heal passes
}

// A joiner that is ready when a member dies is taken into the generation that loss publishes:
// the grow it was promised was for the generation given up, and no other would come.
TEST(Arbiter, AReadyJoinerIsTakenIntoTheGenerationALossPublishes) {
  Job job;
  job.start({"0.0", "1.0", "2.0"});
  job.lose({"1.0"}, "worker 1.0: signal SIGKILL (9)");
  job.after_loss_window();
  job.on(Kind::kReady, {"1.1"});
  const auto published = of(job.lose({"2.0"}, "worker 2.0: signal SIGKILL (9)"), Do::kPublish);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].generation, 2);
  EXPECT_EQ(published[0].ids, (Ids{"0.0", "1.1"}));
  job.after_loss_window();
  EXPECT_TRUE(job.arbiter().joining() == Ids{"2.1"});  // 2.0's restart, not ready yet
}

// Generation 2: worker 0.0, the last holder, and the joiner 1.1, being healed.
void take_in_a_joiner(Job& job) {
  job.start({"0.0", "1.0"});
  job.lose({"1.0"}, "worker 1.0: signal SIGKILL (9)");
  job.after_loss_window();
  job.on(Kind::kReady, {"1.1"});
  job.on(Kind::kReform);
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
  EXPECT_TRUE(of(lost, Do::kPublish).empty()) << "a generation of a joiner only";
  EXPECT_EQ(of(lost, Do::kAbortNotice).size(), 1u);  // the joiner's waits end
  EXPECT_TRUE(of(lost, Do::kRestartGroup).empty()) << "the joiner's word first";
  job.on(Kind::kReform);
  EXPECT_TRUE(of(job.tick(), Do::kRestartGroup).empty());
  job.pass(milliseconds(100));  // the reform delay: a holder says so before it asks
  const auto actions = job.tick();
  EXPECT_TRUE(of(actions, Do::kPublish).empty()) << "a generation of a joiner only";
  const auto restart = of(actions, Do::kRestartGroup);
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_EQ(restart[0].round, 1);
  EXPECT_NE(restart[0].text.find("no worker holding the group's trained state is left"),
            std::string::npos);
  EXPECT_NE(restart[0].text.find("out/checkpoint-epoch-0002.pt"), std::string::npos);
  EXPECT_EQ(job.arbiter().restarts(), 2);  // 1.1, then the group
  // Round 1: the fresh workers form the first generation; they hold the state again (resumed).
  job.on(Kind::kNode, {"0.1", "1.2"});
  const auto published = of(job.tick(), Do::kPublish);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].generation, 3);
  EXPECT_EQ(published[0].ids, (Ids{"0.1", "1.2"}));
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
  job.on(Kind::kHolds, {"1.1"});
  const auto published = of(job.tick(), Do::kPublish);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].ids, Ids{"1.1"});

  Job silent(/*max_restarts=*/1);
  take_in_a_joiner(silent);
  silent.lose({"0.0"}, "worker 0.0: signal SIGKILL (9)");
  silent.pass(seconds(14));
  EXPECT_TRUE(silent.tick().empty());
  silent.pass(seconds(1));
  const auto end = of(silent.tick(), Do::kEnd);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_NE(end[0].text.find("generation 2's members did not say they hold it within 15 s"),
            std::string::npos)
      << end[0].text;
}

// A joiner whose heal passed (it said so) holds the state: the old members' loss leaves it going.
TEST(Arbiter, AHealedJoinerHoldsTheStateWhenTheOldMembersAreLost) {
  Job job;
  job.start({"0.0", "1.0"});
  job.lose({"1.0"}, "worker 1.0: signal SIGKILL (9)");
  job.after_loss_window();
  job.on(Kind::kReady, {"1.1"});
  job.on(Kind::kReform);
  job.pass(milliseconds(100));
  job.tick();
  job.on(Kind::kHolds, {"1.1"});
  const auto published = of(job.lose({"0.0"}, "worker 0.0: signal SIGKILL (9)"), Do::kPublish);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].ids, Ids{"1.1"});
}

// Every worker lost at once: back to the newest checkpoint, in one restart of the group (not one
// restart per worker); without a checkpoint the job ends, naming what was lost; without a restart
// left it ends too.
TEST(Arbiter, EveryWorkerLostAtOnceGoesBackToTheCheckpointOrEnds) {
  ArbiterEvent checkpoint;
  checkpoint.kind = Kind::kCheckpoint;
  checkpoint.what = "out/checkpoint-epoch-0001.pt (after epoch 1)";
  {
    Job job(/*max_restarts=*/1);
    job.start({"0.0", "1.0", "2.0"});
    job.arbiter().on(checkpoint);
    const auto actions = job.lose({"0.0", "1.0", "2.0"}, "every worker: signal SIGKILL (9)");
    EXPECT_EQ(of(actions, Do::kRestartGroup).size(), 1u);
    EXPECT_TRUE(of(actions, Do::kRestartWorker).empty());
    EXPECT_EQ(job.arbiter().phase(), Arbiter::Phase::kForming);
  }
  {
    Job job;
    job.start({"0.0", "1.0", "2.0"});
    const auto end = of(job.lose({"0.0", "1.0", "2.0"}, "three SIGKILLs", 137), Do::kEnd);
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, 137);
    EXPECT_NE(end[0].text.find("(lost: three SIGKILLs); the group wrote no checkpoint"),
              std::string::npos)
        << end[0].text;
    EXPECT_EQ(job.arbiter().phase(), Arbiter::Phase::kEnded);
    EXPECT_TRUE(job.tick().empty());  // ended: nothing more happens
  }
  {
    Job job(/*max_restarts=*/0);
    job.start({"0.0", "1.0"});
    job.arbiter().on(checkpoint);
    const auto end = of(job.lose({"0.0", "1.0"}, "two SIGKILLs"), Do::kEnd);
    ASSERT_EQ(end.size(), 1u);
    EXPECT_NE(end[0].text.find("no restart left (--max-restarts 0)"), std::string::npos);
  }
}

// Losses one after another (the supervisor reaps them apart): each survivor generation is
// published while a holder is left, and a worker is restarted while restarts last.
TEST(Arbiter, RestartsStopAtTheBudgetAndTheSurvivorsGoOn) {
  Job job(/*max_restarts=*/1);
  job.start({"0.0", "1.0", "2.0"});
  job.lose({"0.0"}, "a");
  EXPECT_EQ(of(job.after_loss_window(), Do::kRestartWorker).size(), 1u);
  const auto second = job.lose({"1.0"}, "b");
  EXPECT_TRUE(of(job.after_loss_window(), Do::kRestartWorker).empty());
  ASSERT_EQ(of(second, Do::kPublish).size(), 1u);
  EXPECT_EQ(of(second, Do::kPublish)[0].ids, Ids{"2.0"});
  // The members finish: the job is done, whatever joiner still waits.
  const auto end = of(job.on(Kind::kDone, {"2.0"}), Do::kEnd);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 0);
}

// A program that never said it speaks the protocol (any program but ddp_train --elastic) is
// restarted whole on any failure, as torchrun's elastic agent does; with no restart left the job
// ends with the failed worker's exit code.
TEST(Arbiter, AProgramThatDoesNotTakePartIsRestartedWhole) {
  Job job(/*max_restarts=*/1);
  job.on(Kind::kNode, {"0.0", "1.0"});
  job.tick();
  const auto actions = job.lose({"1.0"}, "worker 1.0: exit code 1", 1);
  EXPECT_TRUE(of(actions, Do::kPublish).empty());
  EXPECT_EQ(of(actions, Do::kAbortNotice).size(), 1u);  // generation 0 is given up
  ASSERT_EQ(of(actions, Do::kRestartGroup).size(), 1u);
  EXPECT_NE(of(actions, Do::kRestartGroup)[0].text.find("does not take part"), std::string::npos);
  job.on(Kind::kNode, {"0.1", "1.1"});
  job.tick();
  const auto end = of(job.lose({"0.1"}, "worker 0.1: exit code 3", 3), Do::kEnd);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 3);
}

// Several nodes: the first generation waits for MAX nodes, or MIN and the last call; a node
// whose beat stands still for the node timeout is out with its workers; below MIN the job ends.
TEST(Arbiter, NodesJoinBeatAndBelowMinTheJobEnds) {
  Job job(/*max_restarts=*/0, /*min_nodes=*/2, /*max_nodes=*/3);
  job.on(Kind::kNode, {"0.0.0", "0.1.0"});
  job.on(Kind::kSpeaks, {"0.0.0"});
  const auto admit = of(job.on(Kind::kNode, {"1.0.0"}, 1), Do::kAdmit);
  ASSERT_EQ(admit.size(), 1u);
  EXPECT_FALSE(admit[0].join);
  EXPECT_TRUE(of(job.tick(), Do::kPublish).empty());  // MIN in, MAX not: the last call runs
  job.pass(seconds(16));
  ASSERT_EQ(of(job.tick(), Do::kPublish).size(), 1u);
  // A late node joins the running group.
  const auto late = of(job.on(Kind::kNode, {"2.0.0"}, 2), Do::kAdmit);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_TRUE(late[0].join);
  // Node 1 beats, then falls silent: out with its worker after the node timeout.
  ArbiterEvent beat;
  beat.kind = Kind::kBeat;
  for (int n : {1, 2}) {
    beat.node = n;
    beat.count = 1;
    beat.now = job.now();
    job.arbiter().on(beat);
  }
  job.pass(seconds(10));
  beat.node = 2;
  beat.count = 2;
  beat.now = job.now();
  job.arbiter().on(beat);
  job.pass(seconds(6));
  const auto dropped = job.tick();
  ASSERT_EQ(of(dropped, Do::kPublish).size(), 1u);
  EXPECT_EQ(of(dropped, Do::kPublish)[0].ids, (Ids{"0.0.0", "0.1.0"}));
  EXPECT_TRUE(of(dropped, Do::kEnd).empty());  // nodes 0 and 2 are in: MIN
  // Node 2 falls silent too: below MIN.
  job.pass(seconds(16));
  const auto end = of(job.tick(), Do::kEnd);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].text, "1 node(s) left in the job, fewer than the 2 of --nnodes 2:3");
}

// A round whose MIN nodes never register ends the job, naming the nodes waited for.
TEST(Arbiter, ARoundWhoseNodesDoNotComeEndsTheJob) {
  Job job(/*max_restarts=*/1, /*min_nodes=*/2, /*max_nodes=*/2);
  job.on(Kind::kNode, {"0.0.0"});
  job.on(Kind::kNode, {"1.0.0"}, 1);
  job.on(Kind::kSpeaks, {"0.0.0"});
  job.tick();
  ArbiterEvent checkpoint;
  checkpoint.kind = Kind::kCheckpoint;
  checkpoint.what = "c.pt";
  job.arbiter().on(checkpoint);
  ASSERT_EQ(of(job.lose({"0.0.0", "1.0.0"}, "both"), Do::kRestartGroup).size(), 1u);
  job.on(Kind::kNode, {"0.0.1"});  // node 0 started again; node 1 never registers
  job.pass(std::chrono::minutes(5) + seconds(1));
  const auto end = of(job.tick(), Do::kEnd);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_NE(end[0].text.find("(waited for node(s) 1)"), std::string::npos) << end[0].text;
}

// Note [Every ending is decided]: a worker that ended 0, or left its training loop, is never a
// member again, and the job ends 0 only once every worker of the last generation ended 0.
TEST(Arbiter, TheJobEndsZeroOnlyWhenEveryWorkerOfTheLastGenerationEndedZero) {
  for (const bool rank0_first : {false, true}) {
    Job job(/*max_restarts=*/0);
    job.start({"0.0", "1.0"});
    job.on(Kind::kTrained, {"0.0"});
    job.on(Kind::kTrained, {"1.0"});
    const Ids first = rank0_first ? Ids{"0.0"} : Ids{"1.0"};
    const Ids last = rank0_first ? Ids{"1.0"} : Ids{"0.0"};
    EXPECT_TRUE(job.on(Kind::kDone, first).empty()) << "one worker still runs";
    EXPECT_TRUE(job.arbiter().members().empty());
    EXPECT_TRUE(job.after_loss_window().empty());
    const auto end = of(job.on(Kind::kDone, last), Do::kEnd);
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, 0);
    EXPECT_EQ(end[0].ids, (Ids{"0.0", "1.0"}));
  }
}

// The first order: rank 1 trains to the end and exits 0, then rank 0, also past its
// training loop, exits 3 (its wrapper's last step failed): the job ends 3 at once, naming it.
// (It published a generation of the ended worker 1.0, and waited for it forever.)
TEST(Arbiter, AFailureAfterAnotherWorkerEndedZeroEndsTheJobWithItsCode) {
  Job job(/*max_restarts=*/0);
  job.start({"0.0", "1.0"});
  job.on(Kind::kTrained, {"1.0"});
  job.on(Kind::kDone, {"1.0"});
  job.on(Kind::kTrained, {"0.0"});
  const auto actions = job.lose({"0.0"}, "worker 0.0 (local rank 0, pid 42): exit code 3", 3);
  EXPECT_TRUE(of(actions, Do::kPublish).empty());
  const auto end = of(actions, Do::kEnd);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 3);
  EXPECT_NE(end[0].text.find("rank 0 of generation 0, worker 0.0 (local rank 0, pid 42): exit "
                             "code 3, after it left its training loop"),
            std::string::npos)
      << end[0].text;
  EXPECT_NE(end[0].text.find("the job failed"), std::string::npos) << end[0].text;
}

// The other order: rank 0, past its loop, exits 3 while rank 1 still runs its ending; the job
// ends 3 then, and not 0 when rank 1 ends (it used to: rank 1 was published alone and finished).
// A worker killed in its ending (SIGKILL after its loop) is the same.
TEST(Arbiter, AFailureAfterTheLoopBeforeTheOthersEndedEndsTheJobWithItsCode) {
  for (const int code : {3, 137}) {
    Job job(/*max_restarts=*/0);
    job.start({"0.0", "1.0"});
    job.on(Kind::kTrained, {"0.0"});
    job.on(Kind::kTrained, {"1.0"});
    const auto end = of(job.lose({"0.0"}, "worker 0.0: how it ended", code), Do::kEnd);
    ASSERT_EQ(end.size(), 1u) << code;
    EXPECT_EQ(end[0].exit_code, code);
    EXPECT_EQ(job.arbiter().phase(), Arbiter::Phase::kEnded);
    EXPECT_TRUE(job.on(Kind::kDone, {"1.0"}).empty());  // ended already, with the failure
  }
}

// A worker killed in the last save (still in its loop: the checkpoint's barrier is the loop's last
// collective) is a loss in training: the survivors, which hold the state, redo the save and end
// 0; its restart, due when the loss window closes, is not needed once they did.
TEST(Arbiter, AWorkerKilledInTheLastSaveIsALossTheOthersFinish) {
  Job job(/*max_restarts=*/1);
  job.start({"0.0", "1.0"});
  const auto published = of(job.lose({"0.0"}, "worker 0.0: signal SIGKILL (9)"), Do::kPublish);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].ids, Ids{"1.0"});
  job.on(Kind::kTrained, {"1.0"});
  const auto end = of(job.on(Kind::kDone, {"1.0"}), Do::kEnd);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 0);
  EXPECT_EQ(end[0].ids, Ids{"1.0"});
  EXPECT_EQ(job.arbiter().restarts(), 0);
}

// With a restart left too: the training is over, a restart would train nothing, and the job
// cannot go on; it ends at once with the failure's code, using no restart.
TEST(Arbiter, WithARestartLeftAFailureAfterTheLoopEndsTheJobToo) {
  Job job(/*max_restarts=*/1);
  job.start({"0.0", "1.0"});
  job.checkpoint();
  job.on(Kind::kTrained, {"1.0"});
  job.on(Kind::kDone, {"1.0"});
  job.on(Kind::kTrained, {"0.0"});
  const auto actions = job.lose({"0.0"}, "worker 0.0: exit code 3", 3);
  EXPECT_TRUE(of(actions, Do::kRestartGroup).empty());
  const auto end = of(actions, Do::kEnd);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 3);
  EXPECT_NE(end[0].text.find("worker 0.0: exit code 3, after it left its training loop: the "
                             "group's training is over"),
            std::string::npos)
      << end[0].text;
  EXPECT_EQ(job.arbiter().restarts(), 0);
}

// A worker out of its loop is never in a new generation: after a collective that completed on
// worker 1.0 only (the last barrier), it ended 0 while the others re-form.
TEST(Arbiter, AWorkerThatLeftItsLoopIsNeverAMemberAgain) {
  Job job;
  job.start({"0.0", "1.0", "2.0"});
  job.on(Kind::kTrained, {"1.0"});
  job.on(Kind::kReform);
  job.pass(milliseconds(100));
  const auto published = of(job.tick(), Do::kPublish);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].ids, (Ids{"0.0", "2.0"}));
  job.on(Kind::kDone, {"1.0"});
  EXPECT_EQ(of(job.lose({"2.0"}, "worker 2.0: signal SIGKILL (9)"), Do::kPublish).at(0).ids,
            Ids{"0.0"});
}

// A program that does not speak the protocol (plain ddp_train, a PyTorch script) says nothing of
// its loop: in either order a failure ends the job with its code (no restart) or restarts the
// whole group, and the job never ends 0 with it.
TEST(Arbiter, AProgramThatDoesNotTakePartEndsWithTheFailureInEitherOrder) {
  for (const bool failure_first : {false, true}) {
    Job job(/*max_restarts=*/0);
    job.on(Kind::kNode, {"0.0", "1.0"});
    job.tick();
    if (!failure_first) {
      EXPECT_TRUE(job.on(Kind::kDone, {"1.0"}).empty());
    }
    const auto end = of(job.lose({"0.0"}, "worker 0.0: exit code 3", 3), Do::kEnd);
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, 3);
    EXPECT_NE(end[0].text.find("rank 0 of generation 0, worker 0.0: exit code 3"),
              std::string::npos)
        << end[0].text;
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
  for (const char* id : {"0.0", "1.0", "2.0"}) {
    for (auto& a : job.lose({id}, std::string("worker ") + id + ": signal SIGKILL (9)")) {
      actions.push_back(a);
    }
    for (auto& a : job.tick()) actions.push_back(a);
    job.pass(milliseconds(40));
  }
  for (auto& a : job.after_loss_window()) actions.push_back(a);
  EXPECT_TRUE(of(actions, Do::kRestartWorker).empty());
  ASSERT_EQ(of(actions, Do::kRestartGroup).size(), 1u);
  EXPECT_EQ(job.arbiter().restarts(), 1);
  EXPECT_TRUE(of(actions, Do::kEnd).empty());
  // Losses a window apart are decisions of their own.
  Job apart(/*max_restarts=*/2);
  apart.start({"0.0", "1.0", "2.0"});
  apart.lose({"0.0"}, "a");
  EXPECT_EQ(of(apart.after_loss_window(), Do::kRestartWorker).size(), 1u);
  apart.lose({"1.0"}, "b");
  EXPECT_EQ(of(apart.after_loss_window(), Do::kRestartWorker).size(), 1u);
}

TEST(Arbiter, WorkerIdsReadBack) {
  EXPECT_EQ(ddp::launch::elastic_worker_id(false, 0, 2, 1), "2.1");
  EXPECT_EQ(ddp::launch::elastic_worker_id(true, 1, 2, 3), "1.2.3");
  EXPECT_EQ(ddp::launch::node_of_worker("1.2.3"), 1);
  EXPECT_EQ(ddp::launch::node_of_worker("2.1"), 0);
  EXPECT_EQ(ddp::launch::local_rank_of_worker("1.2.3"), 2);
  EXPECT_EQ(ddp::launch::local_rank_of_worker("2.1"), 2);
  EXPECT_EQ(ddp::launch::incarnation_of_worker("1.2.3"), 3);
  EXPECT_EQ(ddp::launch::next_incarnation("1.2.3"), "1.2.4");
  EXPECT_EQ(ddp::launch::next_incarnation("0.9"), "0.10");
}

}  // namespace arbiter_test
