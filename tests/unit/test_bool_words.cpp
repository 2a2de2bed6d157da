// The one reading of bool words (ddp/common/bool_words.h) that ddp_train and the launcher share.
#include "ddp/common/bool_words.h"

#include <gtest/gtest.h>

#include "ddp/common/error.h"

namespace {

using Words = std::vector<std::string>;

TEST(BoolWords, TheEightWordsInAnyCaseAndNothingElse) {
  for (const char* word : {"true", "yes", "on", "1", "TRUE", "Yes", "oN"}) {
    EXPECT_EQ(ddp::bool_word(word), true) << word;
  }
  for (const char* word : {"false", "no", "off", "0", "FALSE", "No", "Off"}) {
    EXPECT_EQ(ddp::bool_word(word), false) << word;
  }
  for (const char* word : {"", "t", "f", "y", "n", "2", "01", "true ", "maybe", "--tee"}) {
    EXPECT_EQ(ddp::bool_word(word), std::nullopt) << "'" << word << "'";
  }
}

TEST(BoolWords, ABadWordIsAnInputErrorNamingTheOption) {
  EXPECT_TRUE(ddp::parse_bool("On", "--tee"));
  EXPECT_FALSE(ddp::parse_bool("0", "DDP_LAUNCH_TEE"));
  try {
    ddp::parse_bool("maybe", "DDP_LAUNCH_TEE");
    ADD_FAILURE() << "no InputError";
  } catch (const ddp::InputError& e) {
    EXPECT_STREQ(e.what(), "DDP_LAUNCH_TEE: expected true or false, got 'maybe'");
    EXPECT_EQ(e.exit_code(), ddp::kExitBadInput);
  }
}

bool is_tee(const std::string& name) {
  return name == "tee";
}

TEST(BoolWords, AFlagIsJoinedWithItsValueAndNothingElse) {
  const auto join = [](const Words& words) { return ddp::join_bool_values(words, is_tee); };
  EXPECT_EQ(join({"--tee"}), Words{"--tee=true"});
  EXPECT_EQ(join({"--tee", "false"}), Words{"--tee=false"});
  EXPECT_EQ(join({"--tee", "NO", "x"}), (Words{"--tee=NO", "x"}));
  EXPECT_EQ(join({"--tee=off"}), Words{"--tee=off"});
  EXPECT_EQ(join({"--tee", "--log-dir", "d"}), (Words{"--tee=true", "--log-dir", "d"}));
  EXPECT_EQ(join({"--tee", "maybe"}), (Words{"--tee=true", "maybe"}));  // for the parser to report
  EXPECT_EQ(join({"-tee", "false"}), (Words{"-tee", "false"}));
  EXPECT_EQ(join({"x", "--tee", "1"}), (Words{"x", "--tee=1"}));
  EXPECT_EQ(join({"--", "--tee", "false"}), (Words{"--", "--tee", "false"}));
}

TEST(BoolWords, AnOptionsValueStaysItsOwnWhenTheParserSaysWhichTakeOne) {
  const auto takes_value = [](const std::string& name) { return name == "run-id"; };
  EXPECT_EQ(ddp::join_bool_values({"--run-id", "--tee", "--tee", "0"}, is_tee, takes_value),
            (Words{"--run-id", "--tee", "--tee=0"}));
  EXPECT_EQ(ddp::join_bool_values({"--run-id=x", "--tee"}, is_tee, takes_value),
            (Words{"--run-id=x", "--tee=true"}));
  EXPECT_EQ(ddp::join_bool_values({"--run-id"}, is_tee, takes_value), Words{"--run-id"});
  // Without takes_value only the flags are known (ddp_train's use).
  EXPECT_EQ(ddp::join_bool_values({"--run-id", "--tee"}, is_tee),
            (Words{"--run-id", "--tee=true"}));
}

}  // namespace
