// comm/host_comm.h (internal): the machinery the CPU backends (ring, mpi) share. Operations queue to one
// communication thread per communicator and run there in submission order, so the caller (backward)
// keeps computing while earlier operations are on the wire. GPU tensors are staged through pinned host
// buffers (copy in, reduce on the host, copy back), which is also how several ranks share one GPU.
// Without MPI_THREAD_MULTIPLE there is no communication thread: operations run at submission.
// close() drains the queue and frees the MPI communicator (collective); release_local(), the destructor
// path, fails what is still queued, cancels the running operation where it polls (the ring), waits for the
// thread a bounded moment and otherwise leaves it running on a leaked object.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.h"
#include "core/dtype.h"

namespace ringtrain::comm {

// Completion state shared by a queued task and its handle.
class TaskWork final : public Work {
 public:
  void wait() override;
  bool test() override;
  void complete(std::exception_ptr error);
  void begin() { begin_ = std::chrono::steady_clock::now(); }
  bool ran(TimePoint& begin, TimePoint& end) override;

 private:
  TimePoint begin_, end_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class HostCommunicator : public Communicator {
 public:
  ~HostCommunicator() override;

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override;
  WorkPtr broadcast_async(const Tensor& t, int root) override;
  WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override;
  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override;
  WorkPtr reduce_scatter_shard_async(const Tensor& t, ReduceOp op) override;
  WorkPtr all_gather_shard_async(const Tensor& t) override;
  void barrier() override;
  void close() override;
  bool release_local() noexcept override;

  // Runs `fn` on the communication thread after everything submitted before it (or now, without one).
  WorkPtr submit(std::string what, std::function<void()> fn);
  // Set when release_local() began: operations that poll (the ring's waits) give up with an error.
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 protected:
  HostCommunicator(MPI_Comm parent, const CommOptions& options);
  // Raw host-memory operations, run on the communication thread. Counts are elements of `dtype`.
  virtual void host_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual void host_broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void host_all_gather(const void* in, void* out, int64_t bytes_per_rank) = 0;
  virtual void host_reduce_scatter(const void* in, void* out, int64_t count_per_rank, DType dtype, ReduceOp op) = 0;
  // The halves of host_all_reduce over shard(); by default the whole all-reduce, then a broadcast of each
  // rank's shard from its owner.
  virtual void host_reduce_scatter_shard(void* data, int64_t count, DType dtype, ReduceOp op);
  virtual void host_all_gather_shard(void* data, int64_t count, DType dtype);
  // Derived destructors call it first, while their members are still alive: release_local(), and when
  // that cannot stop the thread (the object was destroyed directly, not through make_communicator's
  // deleter), the thread is detached.
  void stop_for_destruction() noexcept;
  CommOptions options_;

 private:
  struct Task {
    std::function<void()> run;
    std::shared_ptr<TaskWork> work;
  };
  void loop();
  bool threaded_ = false;
  std::mutex mutex_;
  std::condition_variable cv_, exited_cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  bool exited_ = false;     // the thread left its loop (guarded by mutex_)
  bool abandoned_ = false;  // an operation was cancelled mid-way: MPI may still use its buffers
  bool closed_ = false;
  bool detached_ = false;  // the thread was left running in MPI: this object must never be freed
  std::atomic<bool> cancelled_{false};
  std::string broken_;  // set by the first failed operation (guarded by mutex_)
  std::thread thread_;
};

// dst[i] += src[i] (16-bit types accumulate in f32 and round once per call).
void reduce_sum_into(void* dst, const void* src, int64_t count, DType dtype);
// data[i] *= 1 / divisor (floating types only).
void scale_inplace(void* data, int64_t count, DType dtype, int divisor);
// True for the dtypes the collectives reduce.
bool reducible(DType dtype, ReduceOp op);

}  // namespace ringtrain::comm
