// The key-value semantics of the job's rendezvous store (src/comm/store/store_semantics.h) without
// a socket: each request's reply and what it does to the keys, as c10d's Store defines them.
#include <gtest/gtest.h>

#include "ddp/common/error.h"
#include "store/store_semantics.h"

namespace {

using namespace ddp::comm;
using std::chrono::milliseconds;

// The reply to `request`, which must have one now.
StoreMessage reply_to(StoreState& state, StoreOp code, std::vector<std::string> fields) {
  const StoreOutcome outcome = apply_request(state, {code, std::move(fields)});
  EXPECT_TRUE(outcome.reply.has_value());
  return outcome.reply.value_or(StoreMessage{StoreOp::kError, {}});
}

// The fields of a kOk reply.
std::vector<std::string> ok_fields(StoreState& state, StoreOp code,
                                   std::vector<std::string> fields) {
  const StoreMessage reply = reply_to(state, code, std::move(fields));
  EXPECT_EQ(reply.code, StoreOp::kOk);
  return reply.fields;
}

using Fields = std::vector<std::string>;
using Keys = std::map<std::string, std::string>;

TEST(StoreSemantics, SetStoresAndGetOfASetKeyRepliesAtOnce) {
  StoreState state;
  EXPECT_EQ(ok_fields(state, StoreOp::kSet, {"k", std::string("\0v", 2)}), Fields{});
  EXPECT_EQ(state.keys, (Keys{{"k", std::string("\0v", 2)}}));
  EXPECT_EQ(ok_fields(state, StoreOp::kGet, {"k", "1000"}), Fields{std::string("\0v", 2)});
  EXPECT_EQ(ok_fields(state, StoreOp::kSet, {"k", "w"}), Fields{});  // overwrites
  EXPECT_EQ(state.keys.at("k"), "w");
}

TEST(StoreSemantics, GetAndWaitOfMissingKeysHaveNoReplyYetAndKeepTheirTimeout) {
  StoreState state;
  const auto get = apply_request(state, {StoreOp::kGet, {"absent", "1500"}});
  EXPECT_FALSE(get.reply);
  EXPECT_EQ(get.wait_for, milliseconds(1500));
  EXPECT_TRUE(state.keys.empty());  // waiting sets nothing
  state.keys["a"] = "1";
  const auto wait = apply_request(state, {StoreOp::kWait, {"250", "a", "b"}});
  EXPECT_FALSE(wait.reply);  // b is still missing
  EXPECT_EQ(wait.wait_for, milliseconds(250));
  state.keys["b"] = "2";  // as the server applies a parked request again after a set
  EXPECT_EQ(ok_fields(state, StoreOp::kWait, {"250", "a", "b"}), Fields{});
  EXPECT_EQ(ok_fields(state, StoreOp::kWait, {"0"}), Fields{});  // no keys: nothing to wait for
}

TEST(StoreSemantics, AddCountsInDecimalTextFromZero) {
  StoreState state;
  EXPECT_EQ(ok_fields(state, StoreOp::kAdd, {"n", "2"}), Fields{"2"});
  EXPECT_EQ(ok_fields(state, StoreOp::kAdd, {"n", "3"}), Fields{"5"});
  EXPECT_EQ(ok_fields(state, StoreOp::kAdd, {"n", "-7"}), Fields{"-2"});
  EXPECT_EQ(state.keys.at("n"), "-2");
  state.keys["text"] = "abc";  // a value that is no counter
  EXPECT_THROW(apply_request(state, {StoreOp::kAdd, {"text", "1"}}), ddp::InputError);
  EXPECT_THROW(apply_request(state, {StoreOp::kAdd, {"n", "1x"}}), ddp::InputError);
  EXPECT_EQ(state.keys.at("n"), "-2");
}

// torch/csrc/distributed/c10d/HashStore.cpp (HashStore::compareSet): swap on a match; an absent
// key with "" expected is set; an absent key with another expected stays absent and the reply is
// that expected value.
TEST(StoreSemantics, CompareSetFollowsC10d) {
  StoreState state;
  state.keys["k"] = "v";
  EXPECT_EQ(ok_fields(state, StoreOp::kCompareSet, {"k", "v", "w"}), Fields{"w"});  // matched
  EXPECT_EQ(state.keys.at("k"), "w");
  EXPECT_EQ(ok_fields(state, StoreOp::kCompareSet, {"k", "v", "x"}), Fields{"w"});  // did not
  EXPECT_EQ(state.keys.at("k"), "w");
  EXPECT_EQ(ok_fields(state, StoreOp::kCompareSet, {"new", "", "y"}), Fields{"y"});
  EXPECT_EQ(state.keys.at("new"), "y");
  EXPECT_EQ(ok_fields(state, StoreOp::kCompareSet, {"none", "e", "z"}), Fields{"e"});
  EXPECT_EQ(state.keys.count("none"), 0u);
}

TEST(StoreSemantics, CheckDeleteAndNumKeys) {
  StoreState state;
  state.keys = {{"a", "1"}, {"b", ""}};
  EXPECT_EQ(ok_fields(state, StoreOp::kCheck, {"a", "b"}), Fields{"1"});
  EXPECT_EQ(ok_fields(state, StoreOp::kCheck, {"a", "absent"}), Fields{"0"});
  EXPECT_EQ(ok_fields(state, StoreOp::kCheck, {}), Fields{"1"});
  EXPECT_EQ(ok_fields(state, StoreOp::kNumKeys, {}), Fields{"2"});
  EXPECT_EQ(ok_fields(state, StoreOp::kDelete, {"a"}), Fields{"1"});
  EXPECT_EQ(ok_fields(state, StoreOp::kDelete, {"a"}), Fields{"0"});
  EXPECT_EQ(state.keys, (Keys{{"b", ""}}));
  EXPECT_EQ(ok_fields(state, StoreOp::kNumKeys, {}), Fields{"1"});
}

TEST(StoreSemantics, MalformedRequestsAreInputErrorsAndChangeNothing) {
  StoreState state;
  const auto rejects = [&](StoreOp code, Fields fields) {
    EXPECT_THROW(apply_request(state, {code, std::move(fields)}), ddp::InputError)
        << static_cast<int>(code);
  };
  rejects(StoreOp::kSet, {"k"});
  rejects(StoreOp::kGet, {"k"});
  rejects(StoreOp::kGet, {"k", "soon"});
  rejects(StoreOp::kWait, {});
  rejects(StoreOp::kAdd, {"n"});
  rejects(StoreOp::kCompareSet, {"k", "v"});
  rejects(StoreOp::kDelete, {});
  rejects(StoreOp::kHello, {"token"});  // once joined, a hello is no request
  rejects(StoreOp::kOk, {});
  rejects(static_cast<StoreOp>(77), {});
  EXPECT_TRUE(state.keys.empty());
}

}  // namespace
