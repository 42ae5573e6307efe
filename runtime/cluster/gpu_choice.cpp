// runtime/cluster/gpu_choice.cpp: NVML's inventory (runtime/cluster/nvml.h),
// CUDA_VISIBLE_DEVICES, the lock files and the choice.
#include "runtime/cluster/gpu_choice.h"
#include "core/env.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <sstream>
#include <thread>

#include "comm/host_collectives.h"
#include "comm/world.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/parse.h"
#include "runtime/cluster/nvml.h"

namespace ringtrain::runtime {

namespace {

// The user running `pid`, from /proc ("?" when this host's /proc does not show it).
std::string user_of(unsigned pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  if (!in) return "?";
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Uid:", 0) == 0) {
      std::istringstream fields(line.substr(4));
      unsigned uid = 0;
      if (!(fields >> uid)) return "?";
      passwd pw{}, *found = nullptr;
      char buffer[1024];
      if (getpwuid_r(uid, &pw, buffer, sizeof buffer, &found) == 0 && found) return found->pw_name;
      return "uid " + std::to_string(uid);
    }
  return "?";
}

GpuInfo read_device(const Nvml& nvml, unsigned index) {
  GpuInfo g;
  g.nvml_index = static_cast<int>(index);
  void* device = nullptr;
  if (const int rc = nvml.by_index(index, &device); rc != 0) {
    g.error = nvml.why("nvmlDeviceGetHandleByIndex", rc);
    return g;
  }
  char text[128] = {};
  auto fail = [&](const char* what, int rc) {
    if (rc != 0 && g.error.empty()) g.error = nvml.why(what, rc);
    return rc == 0;
  };
  if (fail("nvmlDeviceGetUUID", nvml.uuid(device, text, sizeof text))) g.uuid = text;
  if (fail("nvmlDeviceGetName", nvml.name(device, text, sizeof text))) g.name = text;
  NvmlPciInfo pci{};
  if (fail("nvmlDeviceGetPciInfo", nvml.pci(device, &pci))) g.pci_bus_id = pci.bus_id;
  NvmlMemory memory{};
  if (fail("nvmlDeviceGetMemoryInfo", nvml.memory(device, &memory))) {
    g.mem_used_bytes = static_cast<int64_t>(memory.used);
    g.mem_total_bytes = static_cast<int64_t>(memory.total);
  }
  NvmlUtilization util{};
  if (nvml.utilization(device, &util) == 0) g.util_pct = util.gpu;  // not on every board (MIG)
  std::vector<NvmlProcessInfo> procs(8);
  auto n = static_cast<unsigned int>(procs.size());
  int rc = nvml.processes(device, &n, procs.data());
  if (rc == kNvmlInsufficientSize) {
    procs.resize(n + 8);
    n = static_cast<unsigned int>(procs.size());
    rc = nvml.processes(device, &n, procs.data());
  }
  if (fail("nvmlDeviceGetComputeRunningProcesses", rc))
    for (unsigned i = 0; i < n; ++i)
      g.processes.push_back({procs[i].pid, static_cast<int64_t>(procs[i].used_gpu_memory), user_of(procs[i].pid)});
  unsigned long long count = 0, reasons = 0;
  if (nvml.ecc && nvml.ecc(device, /*uncorrected*/ 1, /*volatile*/ 0, &count) == 0)
    g.ecc_uncorrected = static_cast<int64_t>(count);
  if (nvml.throttle && nvml.throttle(device, &reasons) == 0) g.throttle_reasons = reasons;
  return g;
}

std::string lock_dir_of(const std::string& dir) {
  if (!dir.empty()) return dir;
  return env_text("RINGTRAIN_GPU_LOCK_DIR").value_or("/tmp/ringtrain-gpu-locks");
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

std::string GpuInfo::throttle_text() const {
  std::string out;
  for (const auto& [bit, text] :
       {std::pair{0x4ull, "power cap"}, std::pair{0x8ull, "hardware slowdown"}, std::pair{0x20ull, "thermal slowdown"},
        std::pair{0x40ull, "hardware thermal slowdown"}, std::pair{0x80ull, "power brake"}})
    if (throttle_reasons & bit) out += (out.empty() ? "" : ", ") + std::string(text);
  return out;
}

GpuInventory read_gpu_inventory(const std::string& library) {
  GpuInventory inv;
  const Nvml nvml(Nvml::Use::Inventory, library);
  if (!nvml.ok()) {
    inv.error = nvml.error();
    return inv;
  }
  unsigned int count = 0;
  if (const int rc = nvml.count(&count); rc != 0) {
    inv.error = nvml.why("nvmlDeviceGetCount", rc);
    return inv;
  }
  for (unsigned i = 0; i < count; ++i) inv.gpus.push_back(read_device(nvml, i));
  return inv;
}

std::vector<GpuInfo> visible_gpus(const GpuInventory& inventory, const char* cuda_visible_devices) {
  if (!cuda_visible_devices) return inventory.gpus;
  std::vector<GpuInfo> out;
  std::stringstream entries(cuda_visible_devices);
  for (std::string entry; std::getline(entries, entry, ',');) {
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    if (entry.empty()) continue;
    const GpuInfo* match = nullptr;
    if (const std::optional<int> index = to_number<int>(entry); index && *index >= 0) {
      for (const auto& g : inventory.gpus)
        if (g.nvml_index == *index) match = &g;
    } else {  // a UUID or its unique prefix
      for (const auto& g : inventory.gpus)
        if (!g.uuid.empty() && g.uuid.rfind(entry, 0) == 0) {
          RT_CHECK(!match, "CUDA_VISIBLE_DEVICES entry '", entry, "' matches more than one GPU (", match->uuid, ", ",
                   g.uuid, ")");
          match = &g;
        }
    }
    RT_CHECK(match, "CUDA_VISIBLE_DEVICES='", cuda_visible_devices, "': entry '", entry, "' is no GPU of this host (",
             inventory.gpus.size(), " GPU(s): NVML indices 0 to ", static_cast<int>(inventory.gpus.size()) - 1,
             ", or their UUIDs)");
    out.push_back(*match);
  }
  return out;
}

std::string gpu_busy(const GpuInfo& gpu, const std::set<unsigned>& own_pids, int64_t busy_bytes) {
  if (!gpu.error.empty()) return "unusable: " + gpu.error;
  std::string others;
  int64_t theirs = 0;
  for (const auto& p : gpu.processes)
    if (!own_pids.count(p.pid)) {
      others +=
          detail::str_cat(others.empty() ? "" : ", ", "pid ", p.pid, " (", p.user, ") ", format_bytes(p.used_bytes));
      theirs += p.used_bytes;
    }
  if (!others.empty()) return "used by " + others;
  int64_t ours = 0;
  for (const auto& p : gpu.processes) ours += p.used_bytes;
  if (gpu.mem_used_bytes - ours > busy_bytes)
    return detail::str_cat(format_bytes(gpu.mem_used_bytes - ours), " in use by processes not shown here");
  // Kernels running with none of this job's processes on it: a job this host's /proc cannot show.
  if (gpu.processes.empty() && gpu.util_pct >= 10)
    return detail::str_cat(static_cast<int>(gpu.util_pct), "% utilised by processes not shown here");
  return "";
}

std::set<unsigned> job_pids_on_this_host(const comm::World& world) {
  const int64_t pid = ::getpid();
  const std::vector<int64_t> pids = comm::all_gather(world.comm(), std::span<const int64_t>(&pid, 1));
  std::set<unsigned> own;
  for (int r = 0; r < world.size(); ++r)
    if (world.hosts()[static_cast<size_t>(r)] == world.host())
      own.insert(static_cast<unsigned>(pids[static_cast<size_t>(r)]));
  return own;
}

std::string describe_gpus(const std::vector<GpuInfo>& visible, const std::set<unsigned>& own_pids) {
  std::string out;
  for (size_t i = 0; i < visible.size(); ++i) {
    const GpuInfo& g = visible[i];
    const std::string busy = gpu_busy(g, own_pids);
    out += detail::str_cat("  cuda:", i, " (", g.uuid.empty() ? "?" : g.uuid, ", ",
                           g.pci_bus_id.empty() ? "?" : g.pci_bus_id, "): ", busy.empty() ? "free" : busy, ", ",
                           format_bytes(g.mem_used_bytes), " of ", format_bytes(g.mem_total_bytes), " used, ",
                           static_cast<int>(g.util_pct), "% busy\n");
  }
  return out;
}

std::unique_ptr<GpuLock> GpuLock::try_acquire(const std::string& uuid, std::string* holder, const std::string& dir) {
  const std::string where = lock_dir_of(dir);
  if (::mkdir(where.c_str(), 01777) == 0) ::chmod(where.c_str(), 01777);  // every user's jobs lock here
  std::string name = uuid;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
  const std::string path = where + "/" + name + ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  RT_CHECK(fd >= 0, "the GPU lock file '", path, "' cannot be opened: ", std::strerror(errno),
           " (set RINGTRAIN_GPU_LOCK_DIR to a writable folder shared by this host's jobs)");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (holder) {
      char text[256] = {};
      const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
      *holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string("another process");
      while (!holder->empty() && holder->back() == '\n') holder->pop_back();
    }
    ::close(fd);
    return nullptr;
  }
  const std::string me = detail::str_cat("pid ", ::getpid(), " on ", host_name(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    // The lock holds without its note: another job's message then says "another process".
  }
  return std::unique_ptr<GpuLock>(new GpuLock(fd, path));
}

GpuLock::~GpuLock() { ::close(fd_); }  // releases the flock

std::vector<int> parse_gpu_list(const std::string& text) {
  return parse_number_list<int>("--gpus (GPU indices as CUDA numbers them)", text, {0, 1023});
}

GpuChoice choose_gpu(const GpuChoiceOptions& o, const std::set<unsigned>& own_pids, const std::string& where,
                     const std::function<void(const std::string&)>& on_wait) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  bool waiting = false;
  for (;;) {
    GpuChoice c;
    const GpuInventory inv = read_gpu_inventory(o.library);
    if (!inv.error.empty()) {
      c.note = "GPUs are not chosen by occupancy (" + inv.error + ")";
      return c;
    }
    const char* cvd = o.cuda_visible_devices ? o.cuda_visible_devices : std::getenv("CUDA_VISIBLE_DEVICES");
    const std::vector<GpuInfo> seen = visible_gpus(inv, cvd);
    RT_CHECK(!seen.empty(), where, ": no GPU is visible",
             cvd ? detail::str_cat(" (CUDA_VISIBLE_DEVICES='", cvd, "')") : "", "; use --device cpu");
    std::vector<int> candidates = o.only;
    if (candidates.empty())
      for (int i = 0; i < static_cast<int>(seen.size()); ++i) candidates.push_back(i);
    for (int i : candidates)
      RT_CHECK(i >= 0 && i < static_cast<int>(seen.size()), "--gpus ", i, ": this process's CUDA sees ", seen.size(),
               " GPU(s) (0 to ", seen.size() - 1, ")",
               cvd ? detail::str_cat(" under CUDA_VISIBLE_DEVICES='", cvd, "'") : "");
    std::vector<int> free;
    for (int i : candidates)
      if (gpu_busy(seen[static_cast<size_t>(i)], own_pids).empty()) free.push_back(i);
    std::stable_sort(free.begin(), free.end(), [&](int a, int b) {
      return seen[static_cast<size_t>(a)].mem_used_bytes < seen[static_cast<size_t>(b)].mem_used_bytes;
    });
    std::string locked;
    for (int i : free) {
      std::string holder;
      if (auto lock = GpuLock::try_acquire(seen[static_cast<size_t>(i)].uuid, &holder, o.lock_dir)) {
        c.cuda_index = i;
        c.lock = std::move(lock);
        if (waiting)
          c.note = detail::str_cat("cuda:", i, " came free after ",
                                   std::lround(std::chrono::duration<double>(Clock::now() - start).count()), " s");
        return c;
      }
      locked += detail::str_cat("  cuda:", i, " is free but locked by ", holder, " (another ringtrain job)\n");
    }
    if (o.allow_shared) {
      // The least crowded: fewest other processes, then least memory in use.
      auto load = [&](int i) {
        const GpuInfo& g = seen[static_cast<size_t>(i)];
        int64_t others = 0;
        for (const auto& p : g.processes) others += own_pids.count(p.pid) ? 0 : 1;
        return std::pair{others, g.mem_used_bytes};
      };
      const int best =
          *std::min_element(candidates.begin(), candidates.end(), [&](int a, int b) { return load(a) < load(b); });
      c.cuda_index = best;
      c.shared = true;
      const std::string busy = gpu_busy(seen[static_cast<size_t>(best)], own_pids);
      c.note = detail::str_cat("--allow-shared-gpu: cuda:", best,
                               busy.empty() ? " (free, its lock held elsewhere)" : " is " + busy);
      return c;
    }
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (waited >= o.wait_seconds)
      RT_THROW(
          where, ": no free GPU",
          o.wait_seconds > 0 ? detail::str_cat(" after waiting ", std::lround(waited), " s") : "", " (",
          candidates.size(), " to choose from", o.only.empty() ? "" : " by --gpus", "):\n",
          describe_gpus(seen, own_pids), locked,
          "wait for one with --wait-for-gpu MIN, share a busy one with --allow-shared-gpu, or pick others with --gpus");
    if (!waiting && on_wait)
      on_wait(detail::str_cat(where, ": no free GPU yet; waiting up to ", o.wait_seconds / 60.0,
                              " min (--wait-for-gpu):\n", describe_gpus(seen, own_pids), locked));
    waiting = true;
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(o.poll_seconds, o.wait_seconds - waited)));
  }
}

}  // namespace ringtrain::runtime
