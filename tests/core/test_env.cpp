// The environment variables (core/env.h): a switch is 1 or 0, a number follows the one number rule, each
// refusal names the variable and its value; RINGTRAIN_THREADS and RINGTRAIN_RESTART are read that way.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/check.h"
#include "core/env.h"
#include "core/parallel.h"
#include "test_util.h"

using namespace ringtrain;

namespace {

// Sets a variable for one scope (nullptr: unset) and restores what was there.
struct EnvVar {
  std::string name;
  std::optional<std::string> before;
  EnvVar(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) before = v;
    if (value)
      ::setenv(n, value, 1);
    else
      ::unsetenv(n);
  }
  ~EnvVar() {
    if (before)
      ::setenv(name.c_str(), before->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

std::string error_of_switch(const char* value) {
  EnvVar v("RINGTRAIN_TEST_SWITCH", value);
  try {
    env_switch("RINGTRAIN_TEST_SWITCH", false, "do the thing");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Env, ASwitchIsOneOrZeroAndItsDefaultWhenUnsetOrEmpty) {
  {
    EnvVar v("RINGTRAIN_TEST_SWITCH", nullptr);
    EXPECT_FALSE(env_switch("RINGTRAIN_TEST_SWITCH", false, "x"));
    EXPECT_TRUE(env_switch("RINGTRAIN_TEST_SWITCH", true, "x"));
  }
  {
    EnvVar v("RINGTRAIN_TEST_SWITCH", "");
    EXPECT_TRUE(env_switch("RINGTRAIN_TEST_SWITCH", true, "x"));
  }
  {
    EnvVar v("RINGTRAIN_TEST_SWITCH", "1");
    EXPECT_TRUE(env_switch("RINGTRAIN_TEST_SWITCH", false, "x"));
  }
  {
    EnvVar v("RINGTRAIN_TEST_SWITCH", "0");
    EXPECT_FALSE(env_switch("RINGTRAIN_TEST_SWITCH", true, "x"));
  }
}

TEST(Env, ASwitchRefusesEveryOtherSpellingNamingTheVariable) {
  // Each of these turned RINGTRAIN_CUDA_GRAPH_EMULATE on before (anything but "0" was on).
  for (const char* bad : {"false", "no", "off", "00", " 0", "0 ", "true", "yes", "2", "-1"}) {
    const std::string e = error_of_switch(bad);
    EXPECT_NE(e.find(std::string("RINGTRAIN_TEST_SWITCH='") + bad + "': expected 1 (do the thing) or 0 (off)"),
              std::string::npos)
        << "'" << bad << "': " << e;
  }
}

TEST(Env, NumbersFollowTheOneNumberRule) {
  {
    EnvVar v("RINGTRAIN_TEST_NUMBER", nullptr);
    EXPECT_EQ(env_number<int>("RINGTRAIN_TEST_NUMBER", {1, 8}), std::nullopt);
  }
  {
    EnvVar v("RINGTRAIN_TEST_NUMBER", "8");
    EXPECT_EQ(env_number<int>("RINGTRAIN_TEST_NUMBER", {1, 8}), 8);
  }
  for (const char* bad : {"abc", "1e9", "99999999999", "9", "0", " 4", "0x4", "4.0"}) {
    EnvVar v("RINGTRAIN_TEST_NUMBER", bad);
    std::string e;
    try {
      env_number<int>("RINGTRAIN_TEST_NUMBER", {1, 8});
    } catch (const std::exception& x) {
      e = x.what();
    }
    EXPECT_NE(e.find(std::string("RINGTRAIN_TEST_NUMBER: expected an integer in [1, 8], got '") + bad + "'"),
              std::string::npos)
        << e;
  }
}

TEST(Env, ThreadsAndRestartCountAreCheckedNumbers) {
  {
    EnvVar v("RINGTRAIN_THREADS", "3");
    EXPECT_EQ(threads_from_env(), 3);
  }
  for (const char* automatic : {static_cast<const char*>(nullptr), "", "0"}) {
    EnvVar v("RINGTRAIN_THREADS", automatic);
    EXPECT_EQ(threads_from_env(), std::nullopt);
  }
  // abc was ignored, 1e9 read as 1, 99999999999 crashed a program; 1025 started that many threads.
  for (const char* bad : {"abc", "1e9", "99999999999", "1025", "-2", "2 "}) {
    EnvVar v("RINGTRAIN_THREADS", bad);
    std::string e;
    try {
      threads_from_env();
    } catch (const std::exception& x) {
      e = x.what();
    }
    EXPECT_NE(e.find("RINGTRAIN_THREADS: expected an integer in [0, 1024]"), std::string::npos) << bad << ": " << e;
  }
  {
    EnvVar v("RINGTRAIN_RESTART", "4");
    EXPECT_EQ(restart_count(), 4);
  }
  {
    EnvVar v("RINGTRAIN_RESTART", nullptr);
    EXPECT_EQ(restart_count(), 0);
  }
}

// The table of core/env.cpp gives each switch its default and meaning, each number its range, once.
TEST(Env, TheTableHoldsEachVariablesDefaultMeaningAndRange) {
  {
    EnvVar v("RINGTRAIN_CUDNN_BENCHMARK", nullptr);
    EXPECT_TRUE(ringtrain_switch("RINGTRAIN_CUDNN_BENCHMARK"));  // on unless told otherwise
  }
  {
    EnvVar v("RINGTRAIN_CUDA_SYNC", nullptr);
    EXPECT_FALSE(ringtrain_switch("RINGTRAIN_CUDA_SYNC"));
  }
  {
    EnvVar v("RINGTRAIN_CUDA_SYNC", "yes");
    const std::string e = ringtrain::testing::error_of([] { ringtrain_switch("RINGTRAIN_CUDA_SYNC"); });
    EXPECT_NE(e.find("synchronize after every CUDA op"), std::string::npos) << e;
  }
  {
    EnvVar v("RINGTRAIN_CUDNN_WORKSPACE_MB", "16777217");
    const std::string e = ringtrain::testing::error_of([] { ringtrain_number("RINGTRAIN_CUDNN_WORKSPACE_MB"); });
    EXPECT_NE(e.find("RINGTRAIN_CUDNN_WORKSPACE_MB: expected an integer in [0, 16777216]"), std::string::npos) << e;
  }
  // A name the table lacks, or lists as another kind, is a programming error naming it.
  std::string e = ringtrain::testing::error_of([] { ringtrain_switch("RINGTRAIN_NOT_A_VARIABLE"); });
  EXPECT_NE(e.find("RINGTRAIN_NOT_A_VARIABLE is missing from core/env.cpp's table"), std::string::npos) << e;
  e = ringtrain::testing::error_of([] { ringtrain_number("RINGTRAIN_CUDA_SYNC"); });
  EXPECT_NE(e.find("RINGTRAIN_CUDA_SYNC is not read as core/env.cpp's table lists it"), std::string::npos) << e;
}
