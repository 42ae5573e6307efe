// runtime/cluster/gpu_choice.h: GPUs shared with other people's jobs. Which GPUs this host has and who
// uses them (NVML, loaded at run time like runtime/telemetry/gpu_monitor.h: RINGTRAIN_NVML_LIBRARY or
// libnvidia-ml.so.1), which of them this process's CUDA sees (CUDA_VISIBLE_DEVICES), and the choice of a
// rank's GPU: a free one (no process of another job, little memory in use), never a busy one unless
// --allow-shared-gpu, waiting --wait-for-gpu minutes for one to come free, else an error naming which
// processes (pid, user, memory) hold which GPU. A lock file per GPU, held while the process lives (flock:
// it dies with its holder), keeps two jobs on one host from choosing the same GPU at the same moment.
//
//   GpuInventory inv = read_gpu_inventory();
//   std::vector<GpuInfo> seen = visible_gpus(inv, std::getenv("CUDA_VISIBLE_DEVICES"));
//   GpuChoice c = choose_gpu(options, own_pids, where);   // c.cuda_index, c.lock held
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace ringtrain::comm {
class World;
}

namespace ringtrain::runtime {

struct GpuProcess {
  unsigned pid = 0;
  int64_t used_bytes = 0;
  std::string user;  // from /proc/PID: "?" for a process this host's /proc does not show (another container)
};

struct GpuInfo {
  int nvml_index = 0;  // NVML's numbering (PCI order)
  std::string uuid, pci_bus_id, name;
  int64_t mem_used_bytes = 0, mem_total_bytes = 0;
  double util_pct = 0;
  std::vector<GpuProcess> processes;  // compute processes, all users'
  int64_t ecc_uncorrected = -1;       // volatile uncorrected ECC errors; -1: not reported
  uint64_t throttle_reasons = 0;      // NVML's clock throttle reason bits
  std::string error;                  // not empty: NVML lists the device but cannot read it (fallen off the bus)
  // "power cap, thermal slowdown" from throttle_reasons ("" when none that matter).
  std::string throttle_text() const;
};

struct GpuInventory {
  std::vector<GpuInfo> gpus;
  std::string error;  // not empty: NVML is not usable here (and why); gpus is then empty
};
// Never throws: a missing library or a failed nvmlInit is the inventory's error.
GpuInventory read_gpu_inventory(const std::string& library = "");

// The GPUs this process's CUDA sees, in CUDA's order: CUDA_VISIBLE_DEVICES' entries (NVML indices or UUID
// prefixes "GPU-...") or every GPU when unset (nullptr). An entry no GPU matches is an error naming it.
std::vector<GpuInfo> visible_gpus(const GpuInventory& inventory, const char* cuda_visible_devices);

// Why `gpu` is busy for a job whose processes on this host are `own_pids` ("" when it is free): another
// process on it, more than `busy_bytes` of memory in use or 10% utilisation with no process listed (a job
// /proc cannot show), or it fell off.
std::string gpu_busy(const GpuInfo& gpu, const std::set<unsigned>& own_pids, int64_t busy_bytes = int64_t{1} << 30);
// Collective: the pids of this job's ranks on this rank's host (their CUDA contexts are not another job's).
std::set<unsigned> job_pids_on_this_host(const comm::World& world);
// One line per GPU: "cuda:1 (GPU-..., 0000:17:00.0): pid 4145 (alice) 3.20 GiB, 87% busy".
std::string describe_gpus(const std::vector<GpuInfo>& visible, const std::set<unsigned>& own_pids);

// A lock on one GPU for this process's life. try_acquire never blocks: nullptr when another process
// holds it (`holder` then says who: "pid 123 on host"). The lock files live in `dir`
// (RINGTRAIN_GPU_LOCK_DIR, default /tmp/ringtrain-gpu-locks, created world-writable).
class GpuLock {
 public:
  static std::unique_ptr<GpuLock> try_acquire(const std::string& uuid, std::string* holder = nullptr,
                                              const std::string& dir = "");
  ~GpuLock();
  GpuLock(const GpuLock&) = delete;
  GpuLock& operator=(const GpuLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  GpuLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
};

struct GpuChoiceOptions {
  std::vector<int> only;                       // --gpus: CUDA indices this job may use (empty: all visible)
  bool allow_shared = false;                   // --allow-shared-gpu: a busy GPU when no free one is left
  double wait_seconds = 0;                     // --wait-for-gpu (in seconds here): how long to wait for a free GPU
  double poll_seconds = 10;                    // between looks while waiting
  std::string library;                         // NVML library (tests)
  std::string lock_dir;                        // lock files (tests)
  const char* cuda_visible_devices = nullptr;  // nullptr: the environment's
};

struct GpuChoice {
  int cuda_index = -1;            // -1: NVML is not usable (`note` says why): the caller keeps its own rule
  bool shared = false;            // a busy GPU, by --allow-shared-gpu
  std::unique_ptr<GpuLock> lock;  // held while the rank lives (none when shared or without NVML)
  std::string note;               // what to tell the user ("waited 2 min for a free GPU", "shares cuda:0 with ...")
};
// This rank's GPU. `own_pids`: this job's processes on this host (their CUDA contexts do not make a GPU
// busy). `where` names the rank in messages ("rank 3 on node1"). Errors (ringtrain::Error): no free GPU
// within the wait (naming every visible GPU's holders and the flags that help), --gpus naming a GPU CUDA
// does not see, CUDA_VISIBLE_DEVICES naming one NVML does not have. `on_wait` is called once when waiting starts.
GpuChoice choose_gpu(const GpuChoiceOptions& o, const std::set<unsigned>& own_pids, const std::string& where,
                     const std::function<void(const std::string&)>& on_wait = {});

// "--gpus 0,2" -> {0, 2}; an error names the flag and the text.
std::vector<int> parse_gpu_list(const std::string& text);

}  // namespace ringtrain::runtime
