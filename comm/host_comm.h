// comm/host_comm.h (internal): the machinery the CPU backends (ring, mpi) share. Operations queue to one
// communication thread per communicator and run there in submission order, so the caller (backward)
// keeps computing while earlier operations are on the wire. GPU tensors are staged through pinned host
// buffers (copy in, reduce on the host, copy back), which is also how several ranks share one GPU.
// Without MPI_THREAD_MULTIPLE there is no communication thread: operations run at submission.
#pragma once

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
  void barrier() override;

  // Runs `fn` on the communication thread after everything submitted before it (or now, without one).
  WorkPtr submit(std::string what, std::function<void()> fn);

 protected:
  HostCommunicator(MPI_Comm parent, const CommOptions& options);
  // Raw host-memory operations, run on the communication thread. Counts are elements of `dtype`.
  virtual void host_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual void host_broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void host_all_gather(const void* in, void* out, int64_t bytes_per_rank) = 0;
  virtual void host_reduce_scatter(const void* in, void* out, int64_t count_per_rank, DType dtype,
                                   ReduceOp op) = 0;
  // Stops and joins the communication thread after draining its queue (derived destructors call it
  // first, while their members are still alive).
  void shutdown() noexcept;

  CommOptions options_;

 private:
  void loop();
  bool threaded_ = false;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
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
