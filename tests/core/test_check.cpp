// Tests for core/check.h: the error type and the checking macro family's messages.
#include <gtest/gtest.h>

#include "core/check.h"

namespace ringtrain {
namespace {

int failing_call() { return 7; }
bool ok_if_zero(int s) { return s == 0; }
std::string explain(int s) { return "status " + std::to_string(s) + " means trouble"; }
int device_three() { return 3; }

TEST(Check, CallCheckReportsLibraryCodeTextCallFileLineAndDevice) {
  try {
    RT_CALL_CHECK("FAKE", failing_call(), ok_if_zero, explain, device_three);
    FAIL() << "no exception";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("FAKE error 7"), std::string::npos) << what;
    EXPECT_NE(what.find("status 7 means trouble"), std::string::npos) << what;
    EXPECT_NE(what.find("`failing_call()`"), std::string::npos) << what;
    EXPECT_NE(what.find("test_check.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("device cuda:3"), std::string::npos) << what;
  }
}

TEST(Check, NothrowVariantOnlyReports) {
  ::testing::internal::CaptureStderr();
  EXPECT_NO_THROW(RT_CALL_CHECK_NOTHROW("FAKE", failing_call(), ok_if_zero, explain, device_three));
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("FAKE error 7"), std::string::npos) << err;
}

TEST(Check, RtCheckCarriesMessageAndCondition) {
  int n = -2;
  try {
    RT_CHECK(n > 0, "batch size must be positive, got ", n);
    FAIL() << "no exception";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("batch size must be positive, got -2"), std::string::npos) << what;
    EXPECT_NE(what.find("`n > 0`"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ringtrain
