// apps/ringtrain_env: the preflight doctor, alone or under mpirun.
//   mpirun -np 8 ./ringtrain_env [--data DIR] [--bytes 16M]
// Prints per host the CPU model, cores, memory and GPUs (through NVML: each GPU's processes with their users
// and memory, utilisation, ECC errors and throttling, and a warning for a busy one); each device's free
// memory and the budget a rank
// of it would get (runtime/memory/memory_budget.h: its share among the host's ranks); the library versions (CUDA
// runtime, driver, cuDNN, cuBLAS, NCCL, MPI, HDF5, OpenBLAS, oneDNN); the rank -> host -> device map. Then runs checks,
// each printed as PASS or FAIL with its reason:
//   same build      every rank runs the same ringtrain build against the same library versions
//   self-test       a small MLP learns on every device of every rank
//   all-reduce      a checked, timed all-reduce per available backend, with its busbw
//   data            with --data, every split of the manifest opens and validates (checksums, labels)
// The exit code is non-zero when any check fails on any rank.
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>

#include "comm/host_collectives.h"
#include "comm/world.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/cpu_features.h"
#include "core/device.h"
#include "core/env.h"
#include "core/parallel.h"
#include "runtime/cluster/gpu_choice.h"
#include "runtime/cluster/preflight.h"
#include "runtime/config/cli.h"
#include "runtime/memory/memory_budget.h"
#include "runtime/tools/job_view.h"

using namespace ringtrain;

namespace {

// This host's CPU: the instructions its kernels may use, and how --precision bf16/fp16 runs there.
std::string cpu_report(const comm::World& world) {
  std::string names;
  for (const std::string& n : cpu_features().names()) names += names.empty() ? n : " " + n;
  std::string text =
      detail::str_cat("cpu instructions on ", world.host(), ": ", names.empty() ? "baseline x86-64" : names, "\n");
  for (DType t : {DType::BF16, DType::F16}) {
    const HalfPath h = cpu_half_path(t);
    text += detail::str_cat("  --precision ", t == DType::BF16 ? "bf16" : "fp16", " on the cpu: the ", h.path,
                            " path: ", h.why, "\n");
  }
  return text;
}

// Per device of this host: its free memory and the budget a training rank would check its predicted peak
// against (the ranks sharing the device share it; this process's resident set is left out, a training
// rank adds its own).
std::string memory_report(const comm::World& world) {
  std::string text;
  const runtime::FreeMemory cpu = runtime::host_free_memory();
  const int local = world.local_size();
  text += detail::str_cat("memory on ", world.host(), ": cpu ", cpu.str(), "; budget per rank (", local,
                          " local rank(s)): ", format_bytes(runtime::rank_budget(cpu.bytes, 0, local)), "\n");
  const int gpus = cuda_device_count();
  for (int i = 0; i < gpus; ++i) {
    const Device d = Device::cuda(i);
    const runtime::FreeMemory f = runtime::device_free_memory(d);
    const int sharing = std::max(1, local / gpus + (i < local % gpus ? 1 : 0));  // ranks on cuda:i
    text += detail::str_cat("memory on ", world.host(), ": ", d.str(), " ", f.str(), "; budget per rank (", sharing,
                            " rank(s) on it): ", format_bytes(runtime::rank_budget(f.bytes, 0, sharing)), "\n");
  }
  return text;
}

// Per GPU of this host (NVML): who uses it (pid, user, memory), how busy it is, its ECC errors and
// throttling, and a warning for one a training rank would not take (runtime/cluster/gpu_choice.h).
std::string gpu_report(const comm::World& world, const std::set<unsigned>& own) {
  const runtime::GpuInventory inv = runtime::read_gpu_inventory();
  if (!inv.error.empty()) {
    // Without a GPU, NVML's absence is expected, unless a library was named (RINGTRAIN_NVML_LIBRARY).
    const bool named = env_text("RINGTRAIN_NVML_LIBRARY").has_value();
    if (cuda_device_count() == 0 && !named) return std::string();
    return detail::str_cat(named ? "warning: " : "", "gpus on ", world.host(), ": occupancy unknown (", inv.error,
                           named ? ", the library RINGTRAIN_NVML_LIBRARY names" : "", ")\n");
  }
  std::string text;
  for (const runtime::GpuInfo& g : inv.gpus) {
    std::string procs;
    for (const auto& p : g.processes)
      procs += detail::str_cat(procs.empty() ? "" : ", ", "pid ", p.pid, " (", p.user, ") ", format_bytes(p.used_bytes),
                               own.count(p.pid) ? " [this job]" : "");
    text += detail::str_cat("gpu on ", world.host(), ": nvml ", g.nvml_index, " ", g.uuid, " ", g.name, " (",
                            g.pci_bus_id, "): ", format_bytes(g.mem_used_bytes), " of ",
                            format_bytes(g.mem_total_bytes), " used, ", static_cast<int>(g.util_pct), "% busy");
    if (g.ecc_uncorrected > 0) text += detail::str_cat(", ", g.ecc_uncorrected, " uncorrected ECC error(s)");
    if (!g.throttle_text().empty()) text += ", throttled: " + g.throttle_text();
    text += "; processes: " + (procs.empty() ? std::string("none") : procs) + "\n";
    if (const std::string busy = runtime::gpu_busy(g, own); !busy.empty())
      text += detail::str_cat("warning: gpu nvml ", g.nvml_index, " on ", world.host(), " is ", busy,
                              ": training ranks will not take it without --allow-shared-gpu\n");
  }
  return text;
}

// --watch: redraws the job's view (runtime/tools/job_view.h) every `interval` seconds until its summary appears.
int watch_job(const std::string& path, double interval, bool once) {
  runtime::LogTail tail(path);
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  bool said_waiting = false;
  for (;;) {
    if (!tail.poll()) {
      if (once) {
        std::fprintf(stderr, "ringtrain_env: --watch '%s': no such file (is the job's --log-jsonl this path?)\n",
                     path.c_str());
        return 2;
      }
      if (!said_waiting) std::fprintf(stderr, "ringtrain_env: --watch: waiting for '%s' to appear\n", path.c_str());
      said_waiting = true;
    } else {
      const std::string screen = runtime::render_job_view(tail.last(), tail.seconds_since_change());
      std::printf("%s%s%s", tty ? "\033[H\033[2J" : "", screen.c_str(), tty ? "" : "\n");
      std::fflush(stdout);
      if (once || tail.last().count("summary")) return 0;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(interval));
  }
}

}  // namespace

// What the doctor's flags can do when an allocation fails (runtime::main_error).
constexpr const char* kMemoryHint = "a smaller --bytes for the timed all-reduce";

int main(int argc, char** argv) try {
  CLI::App app{"ringtrain's preflight doctor: machine, libraries, rank map and checks (alone or under mpirun)"};
  std::string data_dir;
  int64_t bytes = int64_t{16} << 20;
  bool decode_all = false;
  CLI::Option* data_option = app.add_option(
      "--data", data_dir,
      "also validate every split of this shard folder, decoding a sample of every shard's encoded records");
  CLI::Option* decode_option =
      app.add_flag("--decode-all", decode_all, "with --data: decode every encoded record, not a sample of each shard")
          ->needs(data_option);
  CLI::Option* bytes_option =
      runtime::add_bytes(app, "--bytes", bytes, "all-reduce size for the timed check (512K, 16M, 1G)")
          ->default_str("16M");
  std::string watch;
  double interval = 2;
  bool once = false;
  CLI::Option* watch_option =
      app.add_option("--watch", watch,
                     "instead of the checks: a one-screen view of a running job from its --log-jsonl file, redrawn "
                     "until the job's summary appears (no MPI needed)")
          ->excludes(data_option)
          ->excludes(decode_option)
          ->excludes(bytes_option);
  runtime::add_number(app, "--interval", interval, "--watch: seconds between redraws", 0.1, 3600.0)
      ->needs(watch_option);
  app.add_flag("--once", once, "--watch: draw once and exit")->needs(watch_option);
  RT_PARSE_FLAGS(app, argc, argv);
  if (!watch.empty()) return watch_job(watch, interval, once);
  return comm::run_main(argc, argv, kMemoryHint, [&](comm::World& world) {
    // The thread count a training rank would get.
    const comm::DeviceBinding cpu = world.bind(Device::cpu());
    const CudaStatus& cuda = cuda_status();

    // ---- facts
    const std::set<unsigned> own = runtime::job_pids_on_this_host(world);
    const auto hosts = comm::gather_strings(world.comm(), world.local_rank() == 0
                                                              ? runtime::host_report(world) + "\n" + cpu_report(world) +
                                                                    memory_report(world) + gpu_report(world, own)
                                                              : "");
    const std::string device =
        cuda.device_count > 0 ? Device::cuda(world.local_rank() % cuda.device_count).str() : "cpu";
    const auto map = comm::gather_strings(
        world.comm(), detail::str_cat(world.host(), " -> ", device, ", ", cpu.threads, " CPU threads"));
    if (world.is_root()) {
      std::printf("%s\n", runtime::build_identity().c_str());
      std::printf("cpu: %d threads for this process (%d cores available, %d local ranks)\n", num_threads(),
                  available_cores(), world.local_size());
      for (const auto& h : hosts)
        if (!h.empty()) std::printf("%s", h.c_str());
      for (int r = 0; r < world.size(); ++r) std::printf("rank %d: %s\n", r, map[r].c_str());
      std::fflush(stdout);
    }

    // ---- checks (each collective; the same verdict on every rank)
    bool all_ok =
        runtime::report_check(world, "same build", runtime::check_same_build(world),
                              detail::str_cat("all ", world.size(), " rank(s) run the same build and libraries"));
    std::vector<Device> devices{Device::cpu()};
    for (int i = 0; i < cuda.device_count; ++i) devices.push_back(Device::cuda(i));
    for (Device d : devices) {
      std::string detail_text;
      const std::string failure = runtime::check_self_test(d, detail_text);
      if (world.is_root() && failure.empty())  // the line the CLI test and users grep for
        std::printf("self-test on %s: %s: ok\n", d.str().c_str(), detail_text.c_str());
      all_ok &= runtime::report_check(world, "self-test on " + d.str(), failure, "every rank");
    }
    std::vector<comm::Backend> backends{comm::Backend::Ring, comm::Backend::Mpi};
    if (comm::auto_backend(world, Device::cpu()) == comm::Backend::Hierarchical)
      backends.insert(backends.begin() + 1, comm::Backend::Hierarchical);
    if (cuda.device_count > 0 && cuda.device_count >= world.local_size()) backends.push_back(comm::Backend::Nccl);
    for (comm::Backend b : backends) {
      const Device dev =
          b == comm::Backend::Nccl ? Device::cuda(world.local_rank() % cuda.device_count) : Device::cpu();
      const runtime::AllReduceCheck check = runtime::check_all_reduce(world, b, dev, bytes);
      all_ok &=
          runtime::report_check(world, detail::str_cat(comm::backend_name(b), " all-reduce"), check.failure,
                                detail::str_cat(format_bytes(bytes), " correct, busbw ", check.busbw_gbs, " GB/s"));
    }
    if (!data_dir.empty()) {
      std::string detail_text;
      const std::string failure = runtime::check_data(data_dir, detail_text, decode_all);
      all_ok &= runtime::report_check(world, "data " + data_dir, failure, detail_text);
    }
    if (world.is_root()) std::printf("%s\n", all_ok ? "all checks passed" : "some checks FAILED");
    return all_ok ? 0 : 1;
  });
} catch (...) {
  return runtime::main_error("ringtrain_env", kMemoryHint);  // no exception escapes main
}
