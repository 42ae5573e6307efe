// Tests for runtime/memory/memory_budget.h: the free memory is MemAvailable unless a cgroup's limit leaves less
// (v2 and v1; "max" and v1's no-limit sentinel do not bound it), a damaged file is named in the error, and a
// rank's budget is what it holds plus its share of the free memory.
#include "runtime/memory/memory_budget.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/check.h"

namespace ringtrain::runtime {
namespace {
namespace fs = std::filesystem;

class MemoryBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("rt_membudget_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "cg" / "memory");
    meminfo("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   16000000 kB\n");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void meminfo(const std::string& text) const { std::ofstream(dir_ / "meminfo") << text; }
  void cgroup(const std::string& name, const std::string& text) const { std::ofstream(dir_ / "cg" / name) << text; }
  FreeMemory free() const { return host_free_memory((dir_ / "meminfo").string(), (dir_ / "cg").string()); }
  fs::path dir_;
};

TEST_F(MemoryBudgetTest, MemAvailableWithoutACgroupLimit) {
  const FreeMemory f = free();
  EXPECT_EQ(f.bytes, int64_t{16000000} * 1024);
  EXPECT_EQ(f.source, "MemAvailable");
  cgroup("memory.max", "max\n");  // v2 without a limit
  cgroup("memory.current", "123456\n");
  EXPECT_EQ(free().bytes, int64_t{16000000} * 1024);
}

TEST_F(MemoryBudgetTest, ACgroupV2LimitBelowMemAvailableBoundsIt) {
  cgroup("memory.max", "8589934592\n");      // 8 GiB
  cgroup("memory.current", "2147483648\n");  // 2 GiB in use
  const FreeMemory f = free();
  EXPECT_EQ(f.bytes, int64_t{6} << 30);
  EXPECT_NE(f.source.find("cgroup v2 memory.max 8.00 GiB"), std::string::npos) << f.source;
  EXPECT_NE(f.str().find("6.00 GiB free (cgroup v2"), std::string::npos) << f.str();
  // A limit above what the machine has free does not raise it.
  cgroup("memory.max", std::to_string(int64_t{64} << 30) + "\n");
  EXPECT_EQ(free().source, "MemAvailable");
  // Usage past the limit leaves nothing, not a negative count.
  cgroup("memory.max", "1000\n");
  cgroup("memory.current", "5000\n");
  EXPECT_EQ(free().bytes, 0);
}

TEST_F(MemoryBudgetTest, ACgroupV1LimitAndItsNoLimitSentinel) {
  cgroup("memory/memory.limit_in_bytes", "4294967296\n");
  cgroup("memory/memory.usage_in_bytes", "1073741824\n");
  EXPECT_EQ(free().bytes, int64_t{3} << 30);
  EXPECT_NE(free().source.find("cgroup v1"), std::string::npos);
  cgroup("memory/memory.limit_in_bytes", "9223372036854771712\n");  // what v1 writes for no limit
  EXPECT_EQ(free().source, "MemAvailable");
}

TEST_F(MemoryBudgetTest, DamagedFilesAreNamed) {
  cgroup("memory.max", "lots\n");
  try {
    free();
    FAIL() << "a cgroup file that is not a number was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory.max"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'lots'"), std::string::npos) << e.what();
  }
  fs::remove(dir_ / "cg" / "memory.max");
  meminfo("MemTotal: 1000 kB\n");
  try {
    free();
    FAIL() << "a meminfo without MemAvailable was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no MemAvailable"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find((dir_ / "meminfo").string()), std::string::npos) << e.what();
  }
  meminfo("MemAvailable: many kB\n");
  EXPECT_THROW(free(), Error);
  EXPECT_THROW(host_free_memory((dir_ / "missing").string(), (dir_ / "cg").string()), Error);
}

TEST(MemoryBudget, TheRealMachineHasSomeFreeMemory) {
  const FreeMemory f = host_free_memory();
  EXPECT_GT(f.bytes, 0) << f.str();
  EXPECT_EQ(device_free_memory(Device::cpu()).bytes > 0, true);
  if (!cuda_available()) {
    EXPECT_THROW(device_free_memory(Device::cuda(0)), Error);
  }
}

TEST(MemoryBudget, ARankHoldsWhatItHasPlusItsShare) {
  EXPECT_EQ(rank_budget(1000, 300, 1), 1300);
  EXPECT_EQ(rank_budget(1000, 300, 4), 550);
  EXPECT_THROW(rank_budget(1000, 300, 0), Error);
  EXPECT_THROW(rank_budget(-1, 0, 1), Error);
}

}  // namespace
}  // namespace ringtrain::runtime
