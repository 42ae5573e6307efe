// Tests for runtime/checkpoint/folder_lock.h: a second live writer of a checkpoint folder is refused, naming the
// holder; a lock whose holder is gone (its pid on this host, no refresh from another host, an earlier launch of the
// same supervised run) is taken over, saying so; the lock goes with its holder.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/checkpoint/folder_lock.h"
#include "runtime/cluster/process.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {
namespace fs = std::filesystem;

class FolderLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("rt_lock_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    ::unsetenv("RINGTRAIN_SUPERVISOR");
    ::unsetenv("RINGTRAIN_RESTART");
    fs::remove_all(dir_);
  }
  // A lock as another process wrote it.
  void write_lock(const std::string& host, int64_t pid, const std::string& supervisor = "") const {
    std::ofstream(dir_ / ".ringtrain-lock") << nlohmann::json{
        {"host", host},
        {"pid", pid},
        {"started", 1700000000},
        {"supervisor", supervisor},
        {"run", "0123456789abcdef"}}.dump();
  }
  void age_lock(int seconds) const {
    const auto t = fs::last_write_time(dir_ / ".ringtrain-lock") - std::chrono::seconds(seconds);
    fs::last_write_time(dir_ / ".ringtrain-lock", t);
  }
  fs::path dir_;
};

TEST_F(FolderLockTest, ASecondLiveWriterIsRefusedNamingTheHolder) {
  // The holder: a child process that takes the lock and waits.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    std::string note;
    auto lock = FolderLock::acquire(dir_, note);
    lock->set_run("fedcba9876543210");
    char c = 1;
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  std::string note;
  const std::string e = testing::error_of([&] { FolderLock::acquire(dir_, note); });
  EXPECT_NE(e.find("is in use by another run: pid " + std::to_string(child) + " on host " + this_host()),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("run fedcba9876543210"), std::string::npos) << e;
  EXPECT_NE(e.find("replace each other's checkpoints"), std::string::npos) << e;
  // Killed (as by MPI_Abort): its pid no longer runs, so the lock is stale and taken over, saying so.
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  auto lock = FolderLock::acquire(dir_, note);
  EXPECT_NE(note.find("took over the lock of '" + dir_.string() + "' from pid " + std::to_string(child)),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("no longer runs"), std::string::npos) << note;
  lock.reset();
  EXPECT_FALSE(fs::exists(dir_ / ".ringtrain-lock")) << "the lock goes with its holder";
}

TEST_F(FolderLockTest, AnotherHostsLockIsStaleOnlyWhenItIsNoLongerRefreshed) {
  write_lock("some-other-host", 4242);
  std::string note;
  const std::string e = testing::error_of([&] { FolderLock::acquire(dir_, note); });
  EXPECT_NE(e.find("pid 4242 on host some-other-host"), std::string::npos) << e;
  age_lock(static_cast<int>(FolderLock::kStaleSeconds) + 5);
  auto lock = FolderLock::acquire(dir_, note);
  EXPECT_NE(note.find("its lock was last refreshed"), std::string::npos) << note;
}

TEST_F(FolderLockTest, ARelaunchOfTheSameSupervisedRunTakesOverAtOnce) {
  write_lock("dead-node", 77, "node0:123:1700000000");
  ::setenv("RINGTRAIN_SUPERVISOR", "node0:123:1700000000", 1);
  ::setenv("RINGTRAIN_RESTART", "0", 1);  // the first launch: a fresh lock of its own supervisor is not stale
  std::string note;
  EXPECT_NE(testing::error_of([&] { FolderLock::acquire(dir_, note); }).find("dead-node"), std::string::npos);
  ::setenv("RINGTRAIN_SUPERVISOR", "node0:999:1700000001", 1);  // another supervisor's relaunch: refused too
  ::setenv("RINGTRAIN_RESTART", "1", 1);
  EXPECT_NE(testing::error_of([&] { FolderLock::acquire(dir_, note); }).find("dead-node"), std::string::npos);
  ::setenv("RINGTRAIN_SUPERVISOR", "node0:123:1700000000", 1);
  auto lock = FolderLock::acquire(dir_, note);
  EXPECT_NE(note.find("an earlier launch of this supervised run"), std::string::npos) << note;
}

TEST_F(FolderLockTest, TheHolderKeepsItsLockFresh) {
  std::string note;
  auto lock = FolderLock::acquire(dir_, note);
  EXPECT_TRUE(note.empty()) << note;
  age_lock(600);
  std::this_thread::sleep_for(std::chrono::milliseconds(5600));  // one refresh period and a bit
  const auto age = std::chrono::duration_cast<std::chrono::seconds>(fs::file_time_type::clock::now() -
                                                                    fs::last_write_time(dir_ / ".ringtrain-lock"));
  EXPECT_LT(age.count(), 10) << "the refresher did not touch the lock";
}

// A lock whose fields have the wrong types is an error naming the file and the key (it once surfaced as
// nlohmann's bare "[json.exception.type_error.302] type must be number, but is string").
TEST_F(FolderLockTest, AWrongTypedFieldIsNamed) {
  for (const auto& [text, key] : {std::pair{R"({"host":"h","pid":"x"})", "key 'pid' must be an integer"},
                                  std::pair{R"({"host":5,"pid":1})", "key 'host' must be a string, got 5"},
                                  std::pair{R"({"host":"h","pid":1,"started":-4})", "key 'started'"}}) {
    std::ofstream(dir_ / ".ringtrain-lock") << text;
    std::string note;
    const std::string e = testing::error_of([&] { FolderLock::acquire(dir_, note); });
    EXPECT_NE(e.find((dir_ / ".ringtrain-lock").string() + "': " + key), std::string::npos) << e;
    EXPECT_NE(e.find("remove the lock file"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace ringtrain::runtime
