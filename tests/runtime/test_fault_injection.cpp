// Tests for runtime/cluster/fault_injection.h: RINGTRAIN_INJECT is parsed strictly (a malformed value is an error
// naming the variable, never ignored) and each fault fires on its rank and step only.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>

#include <sys/wait.h>
#include <unistd.h>

#include "runtime/cluster/fault_injection.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {

TEST(FaultInjection, ParsesTheKinds) {
  const auto t = FaultInjection::parse("throw:1:2");
  EXPECT_EQ(t.kind, FaultInjection::Kind::Throw);
  EXPECT_EQ(t.rank, 1);
  EXPECT_EQ(t.step, 2);
  EXPECT_EQ(FaultInjection::parse("desync:0:5").kind, FaultInjection::Kind::Desync);
  EXPECT_EQ(FaultInjection::parse("hang:3:1").kind, FaultInjection::Kind::Hang);
  EXPECT_EQ(FaultInjection::parse("hang-checkpoint:0:4").kind, FaultInjection::Kind::HangCheckpoint);
  EXPECT_EQ(FaultInjection::parse("stop:1:3").kind, FaultInjection::Kind::Stop);
  EXPECT_EQ(t.attempt, -1);
  EXPECT_EQ(FaultInjection::parse("throw:1:2:3").attempt, 3);
}

TEST(FaultInjection, RejectsMalformedValuesNamingTheVariable) {
  for (const char* bad :
       {"throw", "throw:1", "throw:1:2:3:4", "throw:1:2:", "throw:1:2:x", "boom:1:2", "hang-checkpoint:1:2",
        "throw:x:2", "throw:1:", "throw:-1:2", "throw:1:0", "throw:1:2.5", ":1:2", "throw:1:99999999999999999999"}) {
    const std::string e = testing::error_of([&] { FaultInjection::parse(bad); });
    EXPECT_NE(e.find("RINGTRAIN_INJECT"), std::string::npos) << bad << " -> " << e;
  }
  EXPECT_NE(testing::error_of([] { FaultInjection::parse("boom:1:2"); }).find("unknown kind 'boom'"),
            std::string::npos);
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
  // The checkpoint hang does not fire after the step, only inside the write (which would sleep: not called).
  EXPECT_FALSE(FaultInjection::parse("hang-checkpoint:0:2").fires(0, 2));
  // Nor does the stop (it lands after a micro-batch's forward); off its rank, step or first micro-batch,
  // after_forward returns (were it to fire, this test would stop).
  const auto s = FaultInjection::parse("stop:1:2");
  EXPECT_FALSE(s.fires(1, 2));
  EXPECT_EQ(s.after_step(1, 2), 2);
  s.after_forward(0, 2, 0);
  s.after_forward(1, 1, 0);
  s.after_forward(1, 2, 1);
  s.after_forward(1, 3, 0);
}

// The stop fires: a child process stops itself (SIGSTOP) where the fault says (micro-batch 0 once STEP steps
// are done), and nowhere before.
TEST(FaultInjection, StopStopsTheProcessAfterTheFirstMicroBatch) {
  const auto s = FaultInjection::parse("stop:1:2");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    s.after_forward(1, 1, 0);
    s.after_forward(1, 2, 1);
    s.after_forward(1, 2, 0);  // stops here
    ::_exit(7);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  EXPECT_TRUE(WIFSTOPPED(status)) << status;
  EXPECT_EQ(WSTOPSIG(status), SIGSTOP);
  ::kill(child, SIGCONT);  // it goes on from there
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << status;
}

TEST(FaultInjection, StopWithCudaGraphIsRefused) {
  EXPECT_NO_THROW(FaultInjection::parse("stop:0:1").check_cuda_graph(false));
  EXPECT_NO_THROW(FaultInjection::parse("hang:0:1").check_cuda_graph(true));
  EXPECT_NE(testing::error_of([] { FaultInjection::parse("stop:0:1").check_cuda_graph(true); }).find("--cuda-graph"),
            std::string::npos);
}

// ATTEMPT: the fault of a supervised run fires on that attempt (RINGTRAIN_RESTART) only, so a restart
// gets past it; without ATTEMPT it fires on every attempt.
// A fault after a step the run never reaches would never fire: refused naming the step and the run's last.
TEST(FaultInjection, AStepPastTheRunsEndIsRefused) {
  EXPECT_NO_THROW(FaultInjection::parse("throw:0:10").check_steps(10));
  EXPECT_NO_THROW(FaultInjection{}.check_steps(1));
  EXPECT_NO_THROW(FaultInjection::parse("stop:0:9").check_steps(10));
  EXPECT_NE(testing::error_of([] {
              FaultInjection::parse("stop:0:10").check_steps(10);
            }).find("RINGTRAIN_INJECT: stop lands in the step after step 10, and this run's last step is 10"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              FaultInjection::parse("hang:0:11").check_steps(10);
            }).find("RINGTRAIN_INJECT: step 11 is past this run's last step 10, so the fault would never fire"),
            std::string::npos);
}

TEST(FaultInjection, AttemptLimitsTheFaultToOneLaunch) {
  EXPECT_TRUE(FaultInjection::parse("throw:1:2:0", 0).fires(1, 2));
  EXPECT_FALSE(FaultInjection::parse("throw:1:2:0", 1).fires(1, 2));
  EXPECT_EQ(FaultInjection::parse("throw:1:2:0", 1).after_step(1, 2), 2);
  EXPECT_TRUE(FaultInjection::parse("throw:1:2:1", 1).fires(1, 2));
  EXPECT_TRUE(FaultInjection::parse("throw:1:2", 5).fires(1, 2));
  ::setenv("RINGTRAIN_RESTART", "2", 1);
  ::setenv("RINGTRAIN_INJECT", "throw:0:1:2", 1);
  EXPECT_TRUE(FaultInjection::from_env().fires(0, 1));
  ::setenv("RINGTRAIN_RESTART", "two", 1);
  EXPECT_NE(testing::error_of([] {
              FaultInjection::from_env();
            }).find("RINGTRAIN_RESTART: expected an integer in [0, 1000000000], got 'two'"),
            std::string::npos);
  ::unsetenv("RINGTRAIN_RESTART");
  ::unsetenv("RINGTRAIN_INJECT");
}

}  // namespace
}  // namespace ringtrain::runtime
