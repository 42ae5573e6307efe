// runtime/cluster/gpu_choice.h against the fake NVML (tests/runtime/fake_nvml.c, configured by a file per test):
// the inventory with other users' processes, ECC and throttling; CUDA_VISIBLE_DEVICES by index and UUID;
// a free GPU chosen over busy ones; a busy one only with --allow-shared-gpu; the refusal naming who holds
// what; the wait that ends when a GPU comes free, and the one that times out; two jobs never on one GPU
// (the lock, and that it dies with its holder); a GPU that fell off the bus.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "core/check.h"
#include "runtime/cluster/gpu_choice.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {
namespace fs = std::filesystem;

class GpuChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("rt_gpuchoice_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "locks");
    setenv("FAKE_NVML_FILE", (dir_ / "nvml.txt").c_str(), 1);
  }
  void TearDown() override {
    unsetenv("FAKE_NVML_FILE");
    fs::remove_all(dir_);
  }
  void machine(const std::string& text) const { std::ofstream(dir_ / "nvml.txt") << text; }
  GpuChoiceOptions options() const {
    GpuChoiceOptions o;
    o.library = RINGTRAIN_FAKE_NVML;
    o.lock_dir = (dir_ / "locks").string();
    o.cuda_visible_devices = nullptr;  // the environment's (unset here)
    o.poll_seconds = 0.05;
    return o;
  }
  fs::path dir_;
};

// Two GPUs: 0 used by another user's process (pid 1: init, root), 1 free.
const char* kTwo =
    "gpu GPU-aaaa-0000 0000:17:00.0 H200 40960 143360 95 0 0\n"
    "proc 1 40000\n"
    "gpu GPU-bbbb-1111 0000:65:00.0 H200 300 143360 0 2 24\n";

TEST_F(GpuChoiceTest, InventoryShowsProcessesUsersEccAndThrottling) {
  machine(kTwo);
  const GpuInventory inv = read_gpu_inventory(RINGTRAIN_FAKE_NVML);
  ASSERT_TRUE(inv.error.empty()) << inv.error;
  ASSERT_EQ(inv.gpus.size(), 2u);
  const GpuInfo& a = inv.gpus[0];
  EXPECT_EQ(a.uuid, "GPU-aaaa-0000");
  EXPECT_EQ(a.pci_bus_id, "0000:17:00.0");
  EXPECT_EQ(a.name, "H200");
  EXPECT_EQ(a.mem_used_bytes, int64_t{40960} << 20);
  EXPECT_EQ(a.util_pct, 95);
  ASSERT_EQ(a.processes.size(), 1u);
  EXPECT_EQ(a.processes[0].pid, 1u);
  EXPECT_EQ(a.processes[0].user, "root");
  EXPECT_EQ(a.processes[0].used_bytes, int64_t{40000} << 20);
  const GpuInfo& b = inv.gpus[1];
  EXPECT_EQ(b.ecc_uncorrected, 2);
  EXPECT_EQ(b.throttle_text(), "power cap, thermal slowdown");  // 0x24
  EXPECT_NE(gpu_busy(a, {}).find("used by pid 1 (root)"), std::string::npos) << gpu_busy(a, {});
  EXPECT_EQ(gpu_busy(b, {}), "");
  EXPECT_EQ(gpu_busy(a, {1}), "") << "a job's own process does not make its GPU busy";
  EXPECT_NE(read_gpu_inventory("/nonexistent/libnvidia-ml.so.1").error.find("not loaded"), std::string::npos);
}

TEST_F(GpuChoiceTest, CudaVisibleDevicesByIndexAndUuid) {
  machine(kTwo);
  const GpuInventory inv = read_gpu_inventory(RINGTRAIN_FAKE_NVML);
  EXPECT_EQ(visible_gpus(inv, nullptr).size(), 2u);
  const auto one = visible_gpus(inv, "1");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].uuid, "GPU-bbbb-1111");
  const auto by_uuid = visible_gpus(inv, "GPU-bbbb,0");
  ASSERT_EQ(by_uuid.size(), 2u);
  EXPECT_EQ(by_uuid[0].nvml_index, 1);
  EXPECT_EQ(by_uuid[1].nvml_index, 0);
  EXPECT_TRUE(visible_gpus(inv, "").empty());
  EXPECT_NE(testing::error_of([&] { visible_gpus(inv, "0,7"); }).find("entry '7' is no GPU of this host"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { visible_gpus(inv, "GPU-"); }).find("matches more than one GPU"), std::string::npos);
}

TEST_F(GpuChoiceTest, AFreeGpuIsChosenAndABusyOneOnlyWhenShared) {
  machine(kTwo);
  GpuChoiceOptions o = options();
  GpuChoice c = choose_gpu(o, {}, "rank 0 on test");
  EXPECT_EQ(c.cuda_index, 1);
  EXPECT_FALSE(c.shared);
  ASSERT_TRUE(c.lock);
  // The free GPU is now locked by this job: a second job finds none free, and is told who holds what.
  const std::string refused = testing::error_of([&] { choose_gpu(o, {}, "rank 0 on test"); });
  EXPECT_NE(refused.find("rank 0 on test: no free GPU"), std::string::npos) << refused;
  EXPECT_NE(refused.find("cuda:0 (GPU-aaaa-0000, 0000:17:00.0): used by pid 1 (root)"), std::string::npos) << refused;
  EXPECT_NE(refused.find("cuda:1 is free but locked by pid " + std::to_string(::getpid())), std::string::npos)
      << refused;
  EXPECT_NE(refused.find("--allow-shared-gpu"), std::string::npos) << refused;
  o.allow_shared = true;
  const GpuChoice shared = choose_gpu(o, {}, "rank 0 on test");
  EXPECT_TRUE(shared.shared);
  EXPECT_FALSE(shared.lock);
  EXPECT_EQ(shared.cuda_index, 1) << "the least crowded: no other job's process on it";
  // --gpus restricts the choice; an index CUDA does not see is named.
  o.allow_shared = false;
  o.only = {0};
  EXPECT_NE(testing::error_of([&] { choose_gpu(o, {}, "r"); }).find("by --gpus"), std::string::npos);
  o.only = {5};
  EXPECT_NE(testing::error_of([&] { choose_gpu(o, {}, "r"); }).find("--gpus 5: this process's CUDA sees 2 GPU(s)"),
            std::string::npos);
  // Under CUDA_VISIBLE_DEVICES=0 only the busy one is visible: its index is CUDA's.
  o.only.clear();
  o.cuda_visible_devices = "1";
  c.lock.reset();
  const GpuChoice remapped = choose_gpu(o, {}, "r");
  EXPECT_EQ(remapped.cuda_index, 0) << "NVML's GPU 1 is CUDA's cuda:0 here";
}

TEST_F(GpuChoiceTest, TheLockDiesWithItsHolder) {
  machine(kTwo);
  const pid_t child = ::fork();
  if (child == 0) {  // another job: takes the lock and dies without releasing it
    auto lock = GpuLock::try_acquire("GPU-bbbb-1111", nullptr, (dir_ / "locks").string());
    ::_exit(lock ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(GpuLock::try_acquire("GPU-bbbb-1111", nullptr, (dir_ / "locks").string()))
      << "a dead job's lock must not keep the GPU";
}

TEST_F(GpuChoiceTest, WaitingEndsWhenAGpuComesFreeOrTimesOut) {
  machine("gpu GPU-aaaa-0000 0000:17:00.0 H200 40960 143360 95 0 0\nproc 1 40000\n");
  GpuChoiceOptions o = options();
  o.wait_seconds = 0.2;
  std::string said;
  const std::string timed_out =
      testing::error_of([&] { choose_gpu(o, {}, "r", [&](const std::string& s) { said = s; }); });
  EXPECT_NE(timed_out.find("no free GPU after waiting"), std::string::npos) << timed_out;
  EXPECT_NE(said.find("waiting up to"), std::string::npos) << said;
  // The other job ends while we wait: the GPU is ours.
  o.wait_seconds = 30;
  std::thread ends([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    machine("gpu GPU-aaaa-0000 0000:17:00.0 H200 100 143360 0 0 0\n");
  });
  const GpuChoice c = choose_gpu(o, {}, "r");
  ends.join();
  EXPECT_EQ(c.cuda_index, 0);
  EXPECT_NE(c.note.find("came free after"), std::string::npos) << c.note;
}

TEST_F(GpuChoiceTest, AGpuThatFellOffIsNeverChosen) {
  machine(std::string(kTwo) + "lost\n");
  const GpuInventory inv = read_gpu_inventory(RINGTRAIN_FAKE_NVML);
  ASSERT_EQ(inv.gpus.size(), 2u);
  EXPECT_NE(inv.gpus[1].error.find("GPU is lost"), std::string::npos) << inv.gpus[1].error;
  EXPECT_NE(gpu_busy(inv.gpus[1], {}).find("unusable"), std::string::npos);
  GpuChoiceOptions o = options();
  const std::string refused = testing::error_of([&] { choose_gpu(o, {}, "r"); });
  EXPECT_NE(refused.find("cuda:1 (?, ?): unusable"), std::string::npos) << refused;
}

TEST_F(GpuChoiceTest, MemoryInUseWithoutAVisibleProcessIsBusy) {
  machine("gpu GPU-cccc 0000:01:00.0 A100 8192 81920 0 0 0\n");  // another container's job: no process shown
  const GpuInventory inv = read_gpu_inventory(RINGTRAIN_FAKE_NVML);
  EXPECT_NE(gpu_busy(inv.gpus[0], {}).find("in use by processes not shown here"), std::string::npos);
  machine("gpu GPU-dddd 0000:02:00.0 A100 500 81920 60 0 0\n");  // little memory, but its kernels run
  EXPECT_EQ(gpu_busy(read_gpu_inventory(RINGTRAIN_FAKE_NVML).gpus[0], {}), "60% utilised by processes not shown here");
  EXPECT_EQ(parse_gpu_list("0,2"), (std::vector<int>{0, 2}));
  EXPECT_NE(testing::error_of([] {
              parse_gpu_list("0,x");
            }).find("--gpus (GPU indices as CUDA numbers them): a comma-separated list"),
            std::string::npos);
}

}  // namespace
}  // namespace ringtrain::runtime
