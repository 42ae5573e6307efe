// core/parallel.cpp: a small fixed thread pool with one job at a time (kernels are issued serially).
#include "core/parallel.h"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cpu/cpu_kernels.h"

namespace ringtrain {
namespace {

thread_local bool t_inside_pool = false;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) { resize(threads); }
  // Not synchronised with resize(): both are only called with submit_mutex_ free or held by the caller.
  ~ThreadPool() { stop_workers(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Waits for a running job (submit_mutex_) so workers_ never changes under it.
  void resize(int threads) {
    std::lock_guard<std::mutex> submit(submit_mutex_);
    stop_workers();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = false;
    }
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> submit(submit_mutex_);  // one job at a time
    const int64_t chunks = std::min<int64_t>(size() * 4, (n + grain - 1) / grain);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &fn;
      job_n_ = n;
      job_chunks_ = chunks;
      next_chunk_ = 0;
      remaining_ = chunks;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    work_on_job();
    std::unique_lock<std::mutex> lock(mutex_);
    // Also wait for workers to leave work_on_job, so none reads the next job's fields mid-setup.
    done_.wait(lock, [this] { return remaining_ == 0 && active_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work_on_job() {
    t_inside_pool = true;
    for (;;) {
      int64_t chunk = next_chunk_.fetch_add(1);
      if (chunk >= job_chunks_) break;
      int64_t begin = job_n_ * chunk / job_chunks_, end = job_n_ * (chunk + 1) / job_chunks_;
      try {
        (*job_)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (--remaining_ == 0) done_.notify_all();
    }
    t_inside_pool = false;
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || (generation_ != seen && job_ != nullptr); });
        if (stopping_) return;
        seen = generation_;
        ++active_;
      }
      work_on_job();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--active_ == 0 && remaining_ == 0) done_.notify_all();
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex submit_mutex_, mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  int64_t remaining_ = 0;
  int active_ = 0;  // workers inside work_on_job
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

int default_threads() {
  if (const char* env = std::getenv("RINGTRAIN_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1, available_cores() / std::max(1, local_ranks_from_env()));
}

ThreadPool& pool() {
  // Leaked on purpose: worker threads must not be joined during static destruction.
  static ThreadPool* instance = [] {
    int n = default_threads();
    openblas_set_num_threads(n);
    cpu::set_onednn_threads(n);
    return new ThreadPool(n);
  }();
  return *instance;
}

}  // namespace

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int local_ranks_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE",
                           "SLURM_NTASKS_PER_NODE"}) {
    if (const char* value = std::getenv(name)) {
      int n = std::atoi(value);
      if (n > 0) return n;
    }
  }
  return 1;
}

int num_threads() { return pool().size(); }

void set_num_threads(int n) {
  n = std::max(1, n);
  ThreadPool& p = pool();
  if (p.size() != n) p.resize(n);
  openblas_set_num_threads(n);
  cpu::set_onednn_threads(n);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n <= grain || t_inside_pool) {
    fn(0, n);
    return;
  }
  ThreadPool& p = pool();
  if (p.size() == 1) {
    fn(0, n);
    return;
  }
  p.run(n, grain, fn);
}

}  // namespace ringtrain
