// Tests for runtime/fault_injection.h: RINGTRAIN_INJECT is parsed strictly (a malformed value is an error
// naming the variable, never ignored) and each fault fires on its rank and step only.
#include <gtest/gtest.h>

#include "runtime/fault_injection.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {

TEST(FaultInjection, ParsesTheThreeKinds) {
  const auto t = FaultInjection::parse("throw:1:2");
  EXPECT_EQ(t.kind, FaultInjection::Kind::Throw);
  EXPECT_EQ(t.rank, 1);
  EXPECT_EQ(t.step, 2);
  EXPECT_EQ(FaultInjection::parse("desync:0:5").kind, FaultInjection::Kind::Desync);
  EXPECT_EQ(FaultInjection::parse("hang:3:1").kind, FaultInjection::Kind::Hang);
}

TEST(FaultInjection, RejectsMalformedValuesNamingTheVariable) {
  for (const char* bad : {"throw", "throw:1", "throw:1:2:3", "boom:1:2", "throw:x:2", "throw:1:", "throw:-1:2",
                          "throw:1:0", "throw:1:2.5", ":1:2", "throw:1:99999999999999999999"}) {
    const std::string e = testing::error_of([&] { FaultInjection::parse(bad); });
    EXPECT_NE(e.find("RINGTRAIN_INJECT"), std::string::npos) << bad << " -> " << e;
  }
  EXPECT_NE(testing::error_of([] { FaultInjection::parse("boom:1:2"); }).find("unknown kind 'boom'"), std::string::npos);
}

TEST(FaultInjection, FiresOnItsRankAndStepOnly) {
  const auto t = FaultInjection::parse("throw:1:2");
  EXPECT_EQ(t.after_step(0, 2), 2);
  EXPECT_EQ(t.after_step(1, 1), 1);
  EXPECT_NE(testing::error_of([&] { t.after_step(1, 2); }).find("injected failure at step 2"), std::string::npos);
  const auto d = FaultInjection::parse("desync:0:3");
  EXPECT_EQ(d.after_step(0, 3), 4);
  EXPECT_EQ(d.after_step(0, 4), 4);
  EXPECT_EQ(FaultInjection{}.after_step(0, 1), 1);
}

}  // namespace
}  // namespace ringtrain::runtime
