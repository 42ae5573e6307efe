// Tests for runtime/cluster/watchdog.h: a phase older than the timeout is reported once, naming the step, the
// phase and whether this rank is behind or waiting; phases that keep moving never fire; 0 turns it off.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/world.h"
#include "runtime/cluster/watchdog.h"

namespace ringtrain::runtime {
namespace {

struct Reports {
  std::mutex mutex;
  std::vector<std::string> messages;
  Watchdog::StuckHandler handler() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(m);
    };
  }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> lock(mutex);
    return messages;
  }
};

TEST(Watchdog, FiresOnceNamingTheStepAndThePhase) {
  Reports r;
  Watchdog dog(comm::World::init(), 0.2, r.handler());
  dog.phase("forward", 7);
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  const auto got = r.get();
  ASSERT_EQ(got.size(), 1u) << "a stuck phase is reported once per entry, not at every poll";
  EXPECT_NE(got[0].find("step 7 stuck in forward for 0 s (--timeout 0.2): this rank is the one behind"),
            std::string::npos)
      << got[0];
}

TEST(Watchdog, AWaitingPhaseBlamesAnotherRank) {
  Reports r;
  Watchdog dog(comm::World::init(), 0.2, r.handler());
  dog.phase("gradient all-reduce (waiting for other ranks)", 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const auto got = r.get();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NE(got[0].find("step 3 stuck in gradient all-reduce (waiting for other ranks)"), std::string::npos) << got[0];
  EXPECT_NE(got[0].find("this rank is waiting for others, so some other rank is behind"), std::string::npos) << got[0];
}

TEST(Watchdog, PhasesThatKeepMovingNeverFireAndANewEntryRearms) {
  Reports r;
  Watchdog dog(comm::World::init(), 0.3, r.handler());
  for (int step = 0; step < 12; ++step) {
    dog.phase(step % 2 ? "backward" : "forward", step);
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
  }
  EXPECT_TRUE(r.get().empty());
  EXPECT_STREQ(dog.current_phase(), "backward");
  EXPECT_EQ(dog.current_step(), 11);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  dog.phase("optimizer", 12);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  const auto got = r.get();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NE(got[1].find("step 12 stuck in optimizer"), std::string::npos) << got[1];
}

TEST(Watchdog, APausedClockDoesNotFireUntilTheNextPhase) {
  Reports r;
  Watchdog dog(comm::World::init(), 0.2, r.handler());
  dog.phase("forward", 1);
  dog.pause();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE(r.get().empty());
  dog.phase("backward", 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(r.get().size(), 1u);
  EXPECT_NE(r.get()[0].find("stuck in backward"), std::string::npos);
}

TEST(Watchdog, TimeoutZeroIsOff) {
  Reports r;
  Watchdog dog(comm::World::init(), 0, r.handler());
  dog.phase("forward", 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(r.get().empty());
}

}  // namespace
}  // namespace ringtrain::runtime
