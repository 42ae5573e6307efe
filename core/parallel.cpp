// core/parallel.cpp: parallel_for on OpenMP, the runtime oneDNN's convolutions already use. One set of
// worker threads serves both: with a pool of our own beside OpenMP's, OpenMP's workers spin-wait after
// every convolution while ours need the same cores (with 2 threads on 2 cores a ResNet-20 step was about
// 12% slower that way; docs/PERFORMANCE.md).
#include "core/parallel.h"
#include "core/env.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "core/cpu/cpu_kernels.h"

namespace ringtrain {
namespace {

int default_threads() {
  if (const std::optional<int> n = threads_from_env()) return *n;
  return std::max(1, available_cores() / std::max(1, local_ranks_from_env()));
}

// The thread count, set on first use (also for OpenBLAS and oneDNN).
std::atomic<int>& thread_count() {
  static std::atomic<int> count = [] {
    const int n = default_threads();
    openblas_set_num_threads(n);
    cpu::set_onednn_threads(n);
    return n;
  }();
  return count;
}

}  // namespace

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int local_ranks_from_env() {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    // Set by the launcher, not by a person: a value that is not a positive count is passed over.
    if (const char* value = std::getenv(name)) {
      const std::optional<int> n = to_number<int>(value);
      if (n && *n > 0) return *n;
    }
  }
  return 1;
}

int num_threads() { return thread_count().load(); }

std::optional<int> threads_from_env() {
  const std::optional<int64_t> n = ringtrain_number("RINGTRAIN_THREADS");        // at most kMaxThreads
  return n && *n > 0 ? std::optional<int>(static_cast<int>(*n)) : std::nullopt;  // 0: automatic, as --threads 0
}

void set_num_threads(int n) {
  n = std::max(1, n);
  thread_count().store(n);
  openblas_set_num_threads(n);
  cpu::set_onednn_threads(n);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int threads = num_threads();
  if (n <= grain || threads == 1 || omp_get_level() > 0) {  // inside any parallel region: inline
    fn(0, n);
    return;
  }
  // Chunks handed out one at a time, up to 4 per thread, so uneven chunks balance.
  const int64_t chunks = std::min<int64_t>(int64_t{threads} * 4, (n + grain - 1) / grain);
  std::atomic<int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(threads, chunks)))
  {
    for (;;) {
      const int64_t chunk = next.fetch_add(1);
      if (chunk >= chunks) break;
      try {
        fn(n * chunk / chunks, n * (chunk + 1) / chunks);
      } catch (...) {  // an exception must not leave an OpenMP region
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace ringtrain
