// The one reading of a whole-text integer (ddp/common/whole_number.h) behind the launcher's
// options, the scheduler's and launchers' env variables and the config's values.
#include "ddp/common/whole_number.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace {

TEST(WholeNumber, DigitsWithAnOptionalMinusAndNothingElse) {
  EXPECT_EQ(ddp::whole_number<int>("42", 0, 100), 42);
  EXPECT_EQ(ddp::whole_number<int>("-3", -5, 5), -3);
  for (const char* text : {"", " 4", "4 ", "+4", "4x", "0x10", "4.0", "-", "1e2"}) {
    EXPECT_EQ(ddp::whole_number<int>(text, -100, 100), std::nullopt) << "'" << text << "'";
  }
}

TEST(WholeNumber, OutsideTheRangeOrTheTypeIsNoNumber) {
  EXPECT_EQ(ddp::whole_number<int>("0", 1, 65535), std::nullopt);
  EXPECT_EQ(ddp::whole_number<int>("65536", 1, 65535), std::nullopt);
  EXPECT_EQ(ddp::whole_number<int>("65535", 1, 65535), 65535);
  constexpr auto kMax = std::numeric_limits<int>::max();
  EXPECT_EQ(ddp::whole_number<int>("2147483648", 0, kMax), std::nullopt);
  EXPECT_EQ(ddp::whole_number<int64_t>("2147483648", 0, INT64_MAX), int64_t{2147483648});
}

}  // namespace
