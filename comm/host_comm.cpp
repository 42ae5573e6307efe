// comm/host_comm.cpp: communication thread, host staging of GPU tensors, and the vectorised reductions
// the ring uses.
#include "comm/host_comm.h"

#include <cstring>
#include <type_traits>

#include "comm/mpi_check.h"
#include "core/check.h"
#include "core/device.h"
#include "core/dtype_visit.h"

namespace ringtrain::comm {

// ---------------------------------------------------------------------------------------------------
// TaskWork

void TaskWork::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool TaskWork::test() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

bool TaskWork::ran(TimePoint& begin, TimePoint& end) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_) return false;
  begin = begin_;
  end = end_;
  return true;
}

void TaskWork::complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    end_ = std::chrono::steady_clock::now();
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------------
// Reductions. Plain loops the compiler vectorises; multiversioned like the CPU kernels.

#define RT_COMM_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))

namespace {
template <typename T>
RT_COMM_MULTIVERSION void add_loop(T* __restrict d, const T* __restrict s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}
template <typename S>
RT_COMM_MULTIVERSION void add_loop_16(S* __restrict d, const S* __restrict s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = store_as<S>(load_as<float>(d[i]) + load_as<float>(s[i]));
}
template <typename T, typename C>
void scale_loop(T* d, int64_t n, C inv) {
  for (int64_t i = 0; i < n; ++i) d[i] = store_as<T>(static_cast<C>(load_as<C>(d[i]) * inv));
}
}  // namespace

bool reducible(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::F32:
    case DType::F64:
    case DType::BF16:
    case DType::F16:
      return true;
    case DType::I32:
    case DType::I64:
      return op == ReduceOp::Sum;
    default:
      return false;
  }
}

void reduce_sum_into(void* dst, const void* src, int64_t count, DType dtype) {
  visit_dtype(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    if constexpr (std::is_same_v<S, BFloat16> || std::is_same_v<S, Half>)
      add_loop_16(static_cast<S*>(dst), static_cast<const S*>(src), count);  // summed in f32
    else if constexpr (std::is_same_v<S, uint8_t>)
      RT_THROW("reduce: dtype ", dtype, " cannot be summed");
    else
      add_loop(static_cast<S*>(dst), static_cast<const S*>(src), count);
  });
}

void scale_inplace(void* data, int64_t count, DType dtype, int divisor) {
  if (divisor == 1) return;
  visit_floating(
      dtype,
      [&](auto tag) {
        using S = typename decltype(tag)::type;
        using C = std::conditional_t<std::is_same_v<S, double>, double, float>;  // 16-bit types scale in f32
        scale_loop(static_cast<S*>(data), count, C{1} / static_cast<C>(divisor));
      },
      [&] { RT_THROW("average: dtype ", dtype, " cannot be averaged (sum it instead)"); });
}

// ---------------------------------------------------------------------------------------------------
// HostCommunicator

HostCommunicator::HostCommunicator(MPI_Comm parent, const CommOptions& options)
    : Communicator(parent), options_(options) {
  int level = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&level));
  threaded_ = level == MPI_THREAD_MULTIPLE;
  if (threaded_) thread_ = std::thread([this] { loop(); });
}

HostCommunicator::~HostCommunicator() { stop_for_destruction(); }

void HostCommunicator::loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task.run();  // never throws: errors go into the task's Work
    std::lock_guard<std::mutex> lock(mutex_);
    if (cancelled_) {
      // Cancelled mid-operation: MPI may still read or write the task's tensors and this object's buffers,
      // so neither is ever freed (the process is on its way to MPI_Abort).
      abandoned_ = true;
      new std::function<void()>(std::move(task.run));
      break;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  exited_ = true;
  exited_cv_.notify_all();
}

void HostCommunicator::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    stopping_ = true;  // the thread drains the queue, then leaves
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  free_comm();
}

bool HostCommunicator::release_local() noexcept {
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (detached_) return false;  // asked again: the thread may still be inside MPI with our members
    if (closed_) return true;
    stopping_ = true;
    cancelled_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (auto& t : dropped)
    t.work->complete(std::make_exception_ptr(
        Error(detail::str_cat("the communicator on rank ", rank_, " was destroyed before this operation ran"))));
  bool stopped = !thread_.joinable();
  if (!stopped) {
    // Bounded: a ring operation notices the cancellation within its polling interval (<= 100 us); a
    // blocking MPI call (broadcast, the mpi backend) may never return, and is then left running.
    std::unique_lock<std::mutex> lock(mutex_);
    stopped = exited_cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return exited_; });
  }
  if (!stopped) {
    std::lock_guard<std::mutex> lock(mutex_);
    detached_ = true;
    thread_.detach();
    return false;
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  if (abandoned_) return false;
  free_comm();  // local in practice (no operation is pending on it)
  return true;
}

void HostCommunicator::stop_for_destruction() noexcept {
  if (!release_local() && thread_.joinable()) thread_.detach();
}

WorkPtr HostCommunicator::submit(std::string what, std::function<void()> fn) {
  auto work = std::make_shared<TaskWork>();
  auto task = [this, work, what = std::move(what), fn = std::move(fn), rank = rank_]() {
    auto fail = [&](const std::string& reason) {
      // A failed operation may leave messages in flight: every later operation would mismatch them.
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (broken_.empty()) broken_ = what + ": " + reason;
      }
      work->complete(std::make_exception_ptr(Error(detail::str_cat(what, " failed on rank ", rank, ": ", reason))));
    };
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!broken_.empty()) {
        const std::string earlier = broken_;
        lock.unlock();
        work->complete(std::make_exception_ptr(Error(detail::str_cat(
            what, " on rank ", rank, ": the communicator is unusable after an earlier failure (", earlier, ")"))));
        return;
      }
    }
    try {
      work->begin();
      fn();
      work->complete(nullptr);
    } catch (const std::exception& e) {
      fail(e.what());
    } catch (...) {
      fail("unknown exception");
    }
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    RT_CHECK(!closed_ && !stopping_, what, " on rank ", rank_, ": the communicator is closed");
    if (threaded_) {
      queue_.push_back(Task{std::move(task), work});
      cv_.notify_one();
      return work;
    }
  }
  task();
  return work;
}

namespace {
// A host view of `t` for the communication thread: the tensor itself on the CPU, otherwise a pinned copy
// made after the work queued so far on the caller's stream (the event) and written back afterwards.
struct HostStage {
  Tensor device_tensor, host;
  Event ready;
  bool staged = false;

  HostStage(const Tensor& t, bool copy_in) : device_tensor(t) {
    if (t.device().is_cpu()) {
      host = t;
      return;
    }
    staged = true;
    ready = Event::create(t.device());
    ready.record(current_stream());
    copy_in_ = copy_in;
  }
  // On the communication thread.
  void* begin() {
    if (!staged) return host.data_ptr();
    set_current_device(device_tensor.device());  // the thread's copies and pinned memory on this GPU
    ready.synchronize();
    host = Tensor::empty_pinned(device_tensor.shape(), device_tensor.dtype());
    if (copy_in_) host.copy_(device_tensor);
    return host.data_ptr();
  }
  void end() {
    if (!staged) return;
    device_tensor.copy_(host);
    synchronize(device_tensor.device());
  }

 private:
  bool copy_in_ = true;
};

std::string op_text(const char* op, const Tensor& t) { return detail::str_cat(op, "(", t.describe(), ")"); }
}  // namespace

void check_collective_tensor(const char* op, const Tensor& t, int rank) {
  RT_CHECK(t.defined(), op, " on rank ", rank, ": the tensor is undefined");
}

WorkPtr HostCommunicator::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_collective_tensor("all_reduce", t, rank_);
  RT_CHECK(reducible(t.dtype(), op), "all_reduce on rank ", rank_, ": dtype ", t.dtype(), " cannot be ",
           op == ReduceOp::Sum ? "summed" : "averaged", " (", t.describe(), ")");
  auto stage = std::make_shared<HostStage>(t, true);
  return submit(op_text("all_reduce", t), [this, stage, op, count = t.numel(), dtype = t.dtype()] {
    void* data = stage->begin();
    host_all_reduce(data, count, dtype, op);
    stage->end();
  });
}

WorkPtr HostCommunicator::broadcast_async(const Tensor& t, int root) {
  check_collective_tensor("broadcast", t, rank_);
  RT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a world of ", size_);
  auto stage = std::make_shared<HostStage>(t, rank_ == root);
  return submit(op_text("broadcast", t), [this, stage, root, bytes = t.nbytes()] {
    void* data = stage->begin();
    host_broadcast(data, bytes, root);
    stage->end();
  });
}

WorkPtr HostCommunicator::all_gather_async(const Tensor& in, const Tensor& out) {
  check_collective_tensor("all_gather", in, rank_);
  check_collective_tensor("all_gather", out, rank_);
  RT_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * size_, "all_gather on rank ", rank_, ": output ",
           out.describe(), " must hold ", size_, " x ", in.numel(), " elements of ", in.dtype());
  auto sin = std::make_shared<HostStage>(in, true);
  auto sout = std::make_shared<HostStage>(out, false);
  return submit(op_text("all_gather", in), [this, sin, sout, bytes = in.nbytes()] {
    const void* src = sin->begin();
    void* dst = sout->begin();
    host_all_gather(src, dst, bytes);
    sout->end();
  });
}

WorkPtr HostCommunicator::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) {
  check_collective_tensor("reduce_scatter", in, rank_);
  check_collective_tensor("reduce_scatter", out, rank_);
  RT_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * size_, "reduce_scatter on rank ", rank_, ": input ",
           in.describe(), " must hold ", size_, " x ", out.numel(), " elements of ", out.dtype());
  RT_CHECK(reducible(in.dtype(), op), "reduce_scatter on rank ", rank_, ": dtype ", in.dtype(), " cannot be reduced");
  auto sin = std::make_shared<HostStage>(in, true);
  auto sout = std::make_shared<HostStage>(out, false);
  return submit(op_text("reduce_scatter", in), [this, sin, sout, op, count = out.numel(), dtype = out.dtype()] {
    const void* src = sin->begin();
    void* dst = sout->begin();
    host_reduce_scatter(src, dst, count, dtype, op);
    sout->end();
  });
}

WorkPtr HostCommunicator::reduce_scatter_shard_async(const Tensor& t, ReduceOp op) {
  check_collective_tensor("reduce_scatter_shard", t, rank_);
  RT_CHECK(reducible(t.dtype(), op), "reduce_scatter_shard on rank ", rank_, ": dtype ", t.dtype(), " cannot be ",
           op == ReduceOp::Sum ? "summed" : "averaged", " (", t.describe(), ")");
  auto stage = std::make_shared<HostStage>(t, true);
  return submit(op_text("reduce_scatter_shard", t), [this, stage, op, count = t.numel(), dtype = t.dtype()] {
    void* data = stage->begin();
    host_reduce_scatter_shard(data, count, dtype, op);
    stage->end();
  });
}

WorkPtr HostCommunicator::all_gather_shard_async(const Tensor& t) {
  check_collective_tensor("all_gather_shard", t, rank_);
  auto stage = std::make_shared<HostStage>(t, true);
  return submit(op_text("all_gather_shard", t), [this, stage, count = t.numel(), dtype = t.dtype()] {
    void* data = stage->begin();
    host_all_gather_shard(data, count, dtype);
    stage->end();
  });
}

void HostCommunicator::host_reduce_scatter_shard(void* data, int64_t count, DType dtype, ReduceOp op) {
  host_all_reduce(data, count, dtype, op);
}

void HostCommunicator::host_all_gather_shard(void* data, int64_t count, DType dtype) {
  const int64_t es = dtype_size(dtype);
  for (int r = 0; r < size_; ++r) {
    const auto [first, last] = even_shard(count, r, size_);  // Communicator::shard of rank r
    if (last > first) host_broadcast(static_cast<char*>(data) + first * es, (last - first) * es, r);
  }
}

void HostCommunicator::barrier() {
  submit("barrier", [this] { MPI_CHECK(MPI_Barrier(comm_)); })->wait();
}

}  // namespace ringtrain::comm
