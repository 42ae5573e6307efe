// comm/nccl.cpp: the nccl backend, NCCL collectives on GPU tensors (CUDA builds; others compile
// comm/nccl_none.cpp).
//
// Creation is collective over the parent: rank 0's ncclUniqueId travels by MPI_Bcast on the private MPI
// duplicate, and every rank makes a non-blocking NCCL communicator (config.blocking = 0) on the calling
// thread's current CUDA device, polling ncclCommGetAsyncError until it is ready or CommOptions.timeout
// has passed. Local failures are agreed on (agree_or_throw) so that every rank raises the same error.
//
// Every operation runs on the communicator's own non-blocking stream:
//   - ordered after the caller's compute: an event recorded on current_stream() that our stream waits on;
//   - launched inside ncclGroupStart/ncclGroupEnd; a non-blocking communicator may answer ncclInProgress,
//     so we poll ncclCommGetAsyncError until the launch has settled;
//   - a completion event is recorded on our stream and the call returns at once: the caller's stream
//     does not wait, so backward keeps computing while the collective is on the wire.
// Work::wait() polls the completion event and the communicator's asynchronous error; past the timeout
// it aborts the communicator (a dead or stuck peer would otherwise hang every rank forever) and raises.
// On success it makes current_stream() wait on the event. After an abort every operation raises at once.
// One mutex per communicator serialises every NCCL call on it (launch order must match across ranks
// anyway). The destructor drains the stream and finalizes, bounded by the same timeout, else aborts.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/backends.h"
#include "comm/host_comm.h"
#include "comm/mpi_check.h"
#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/device_guard.h"
#include "core/device.h"
#include "core/tensor.h"

// Non-blocking calls may answer "not finished yet", which is not an error: ncclInProgress from a
// non-blocking communicator, cudaErrorNotReady from a query.
#define RT_DETAIL_NCCL_OK_OR_PENDING(s) ((s) == ncclSuccess || (s) == ncclInProgress)
#define NCCL_CHECK_PENDING(call)                                                                                \
  RT_CALL_CHECK_T("NCCL", call, #call, RT_DETAIL_NCCL_OK_OR_PENDING, ::ringtrain::cuda_detail::nccl_error_text, \
                  RT_DETAIL_CUDA_DEVICE)
#define NCCL_CHECK_PENDING_NOTHROW(call)                                     \
  RT_CALL_CHECK_NOTHROW_T("NCCL", call, #call, RT_DETAIL_NCCL_OK_OR_PENDING, \
                          ::ringtrain::cuda_detail::nccl_error_text, RT_DETAIL_CUDA_DEVICE)
#define RT_DETAIL_CUDA_OK_OR_NOT_READY(s) ((s) == cudaSuccess || (s) == cudaErrorNotReady)
#define CUDA_CHECK_QUERY(call)                                                                                    \
  RT_CALL_CHECK_T("CUDA", call, #call, RT_DETAIL_CUDA_OK_OR_NOT_READY, ::ringtrain::cuda_detail::cuda_error_text, \
                  RT_DETAIL_CUDA_DEVICE)

namespace ringtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::microseconds(50);

cudaStream_t as_stream(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }
cudaEvent_t as_event(const Event& e) { return static_cast<cudaEvent_t>(e.handle()); }

// True once everything recorded before `e` has run.
bool event_done(const Event& e) {
  cudaError_t status = cudaSuccess;
  CUDA_CHECK_QUERY(status = cudaEventQuery(as_event(e)));
  return status == cudaSuccess;
}

bool stream_idle(const Stream& s) {
  cudaError_t status = cudaSuccess;
  CUDA_CHECK_QUERY(status = cudaStreamQuery(as_stream(s)));
  return status == cudaSuccess;
}

// "NCCL error 6 (remote process exited or there was a network error): <NCCL's last message>".
std::string nccl_failure(ncclComm_t comm, ncclResult_t status) {
  std::string text = detail::str_cat("NCCL error ", static_cast<int>(status), " (", ncclGetErrorString(status), ")");
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') text += detail::str_cat(": ", last);
  return text;
}

// Polls until the communicator's last non-blocking call has settled. Returns its final state (ncclSuccess
// or an error), or ncclInProgress when `deadline` passed first.
ncclResult_t settle(ncclComm_t comm, Clock::time_point deadline) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state != ncclInProgress || Clock::now() >= deadline) return state;
    std::this_thread::sleep_for(kPollInterval);
  }
}

// ncclGroupStart now, ncclGroupEnd at end(). A group left open by an error is closed by the destructor
// (otherwise every later NCCL call of this thread would join it).
class NcclGroup {
 public:
  NcclGroup() { NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) NCCL_CHECK_PENDING_NOTHROW(ncclGroupEnd());
  }
  void end() {
    open_ = false;
    NCCL_CHECK_PENDING(ncclGroupEnd());
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

 private:
  bool open_ = true;
};

// What the communicator and its handles share: handles may outlive the communicator.
struct NcclState {
  std::mutex mutex;           // guards `comm`, `abort_reason` and every NCCL call on the communicator
  ncclComm_t comm = nullptr;  // null once destroyed or aborted
  std::atomic<bool> aborted{false};
  std::string abort_reason;
  int rank = 0;
  std::chrono::milliseconds timeout{0};
  // Tensors of handles dropped before completion, kept until their event passes (guarded by mutex).
  std::vector<std::pair<Event, std::vector<Tensor>>> orphans;

  void adopt(Event done, std::vector<Tensor> keep) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mutex);
      orphans.emplace_back(std::move(done), std::move(keep));
    } catch (...) {
      // Out of memory while unwinding: the tensors would be released early; nothing better is possible.
    }
  }
  // Releases the orphans whose operation has finished; the caller holds `mutex`.
  void reap_locked() {
    std::erase_if(orphans, [](const auto& o) {
      try {
        return !o.first.handle() || event_done(o.first);
      } catch (...) {
        return false;
      }
    });
  }

  // Aborts the communicator (once) and remembers why; the caller holds `mutex`. Never throws.
  void abort_locked(const std::string& reason) noexcept {
    if (comm != nullptr) {
      NCCL_CHECK_PENDING_NOTHROW(ncclCommAbort(comm));
      comm = nullptr;
    }
    if (!aborted.load()) {
      try {
        abort_reason = reason;
      } catch (...) {
      }
      aborted.store(true);
    }
  }
};

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    default:
      RT_THROW("nccl: dtype ", dtype, " cannot be reduced");
  }
}

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> state, std::string what, Event done, std::vector<Tensor> keep,
           Clock::time_point deadline)
      : state_(std::move(state)),
        what_(std::move(what)),
        done_(std::move(done)),
        keep_(std::move(keep)),
        deadline_(deadline) {}

  // A handle dropped without wait() does not wait (destructors never block): its tensors must not go back
  // to the caching allocator (and be reused by the caller's stream) while NCCL still reads or writes them,
  // so the communicator's state keeps them, with the completion event, until the event has passed.
  ~NcclWork() override {
    if (finished_.load()) return;
    state_->adopt(std::move(done_), std::move(keep_));
  }

  void wait() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!finished_.load()) {
        try {
          poll();
        } catch (...) {
          error_ = std::current_exception();
        }
        finished_.store(true);
      }
    }
    if (error_) std::rethrow_exception(error_);
    // Host and device agree it is done; this also orders the caller's later kernels formally.
    done_.wait_on(current_stream());
  }

  // Complete, or failed (aborted, timed out, a CUDA error) so that wait() raises at once.
  bool test() override {
    if (finished_.load()) return true;
    try {
      if (event_done(done_)) return true;
    } catch (const std::exception&) {
      return true;
    }
    return state_->aborted.load() || Clock::now() >= deadline_;
  }

 private:
  // Returns once the completion event has passed; raises (after aborting the communicator where that is
  // the cure) on an NCCL error, a timeout, or an earlier abort.
  void poll() {
    for (;;) {
      if (event_done(done_)) return;
      {
        std::lock_guard<std::mutex> lock(state_->mutex);
        const int rank = state_->rank;
        if (state_->aborted.load()) {
          RT_THROW(what_, " on rank ", rank, " failed: the communicator was aborted (", state_->abort_reason, ")");
        }
        if (state_->comm == nullptr) {
          RT_THROW(what_, " on rank ", rank, ": the communicator was destroyed before the operation completed");
        }
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(state_->comm, &async));
        if (async != ncclSuccess && async != ncclInProgress) {
          const std::string text = detail::str_cat(what_, " failed on rank ", rank, ": ",
                                                   nccl_failure(state_->comm, async), "; communicator aborted");
          state_->abort_locked(text);
          throw Error(text);
        }
        if (Clock::now() >= deadline_) {
          if (event_done(done_)) return;
          const std::string text =
              detail::str_cat(what_, " on rank ", rank, " timed out after ", state_->timeout.count(),
                              " ms: a peer is probably dead or stuck; communicator aborted");
          state_->abort_locked(text);
          throw Error(text);
        }
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  std::shared_ptr<NcclState> state_;
  std::string what_;  // "nccl all_reduce(f32[4] on cuda:0)"
  Event done_;
  std::vector<Tensor> keep_;  // alive until the handle goes
  Clock::time_point deadline_;
  std::mutex mutex_;  // one poller at a time
  std::atomic<bool> finished_{false};
  std::exception_ptr error_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm parent, const CommOptions& options) : Communicator(parent) {
    try {
      init(options);
    } catch (...) {
      free_comm();  // the base class destructor does not, and ours does not run
      throw;
    }
  }

  ~NcclCommunicator() override { release_local(); }

  // Drains our stream, finalizes and destroys the NCCL communicator, all bounded by the timeout; on a
  // failure the communicator is aborted and the error raised.
  void close() override {
    if (closed_) return;
    closed_ = true;
    std::string failure = shutdown();
    free_comm();
    if (!failure.empty())
      RT_THROW("closing the nccl communicator on rank ", rank_, " failed (it was aborted): ", failure);
  }

  // Local: ncclCommAbort ends our operations without waiting for any peer.
  bool release_local() noexcept override {
    if (!closed_) {
      closed_ = true;
      if (state_) {
        std::lock_guard<std::mutex> lock(state_->mutex);
        state_->abort_locked("the communicator was destroyed without close() (an error elsewhere)");
      }
      free_comm();
    }
    return true;
  }

  Backend backend() const override { return Backend::Nccl; }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_tensor("all_reduce", t);
    RT_CHECK(reducible(t.dtype(), op), "all_reduce on rank ", rank_, ": dtype ", t.dtype(), " cannot be ",
             op == ReduceOp::Sum ? "summed" : "averaged", " (", t.describe(), ")");
    const ncclDataType_t type = nccl_type(t.dtype());
    const ncclRedOp_t red = op == ReduceOp::Sum ? ncclSum : ncclAvg;
    return launch("all_reduce", t, {t}, [&](ncclComm_t comm, cudaStream_t stream) {
      if (t.numel() == 0) return;
      NCCL_CHECK_PENDING(
          ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), type, red, comm, stream));
    });
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_tensor("broadcast", t);
    RT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a world of ", size_);
    // Bytes: any dtype travels.
    return launch("broadcast", t, {t}, [&](ncclComm_t comm, cudaStream_t stream) {
      if (t.nbytes() == 0) return;
      NCCL_CHECK_PENDING(
          ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.nbytes()), ncclUint8, root, comm, stream));
    });
  }

  WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override {
    check_tensor("all_gather", in);
    check_tensor("all_gather", out);
    RT_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * size_, "all_gather on rank ", rank_, ": output ",
             out.describe(), " must hold ", size_, " x ", in.numel(), " elements of ", in.dtype());
    return launch("all_gather", in, {in, out}, [&](ncclComm_t comm, cudaStream_t stream) {
      if (in.nbytes() == 0) return;
      NCCL_CHECK_PENDING(
          ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.nbytes()), ncclUint8, comm, stream));
    });
  }

  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override {
    check_tensor("reduce_scatter", in);
    check_tensor("reduce_scatter", out);
    RT_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * size_, "reduce_scatter on rank ", rank_,
             ": input ", in.describe(), " must hold ", size_, " x ", out.numel(), " elements of ", out.dtype());
    RT_CHECK(reducible(in.dtype(), op), "reduce_scatter on rank ", rank_, ": dtype ", in.dtype(), " cannot be reduced");
    const ncclDataType_t type = nccl_type(in.dtype());
    const ncclRedOp_t red = op == ReduceOp::Sum ? ncclSum : ncclAvg;
    return launch("reduce_scatter", in, {in, out}, [&](ncclComm_t comm, cudaStream_t stream) {
      if (out.numel() == 0) return;
      NCCL_CHECK_PENDING(
          ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), type, red, comm, stream));
    });
  }

  void barrier() override { all_reduce_async(barrier_buffer_, ReduceOp::Sum)->wait(); }

  // Point-to-point, for comm/p2p.h's channel: bytes to or from `peer` on this communicator's stream.
  WorkPtr send_async(const Tensor& t, int peer) {
    check_tensor("send", t);
    RT_CHECK(peer >= 0 && peer < size_ && peer != rank_, "nccl send on rank ", rank_, ": no peer ", peer);
    return launch("send", t, {t}, [&](ncclComm_t comm, cudaStream_t stream) {
      if (t.nbytes() > 0)
        NCCL_CHECK_PENDING(ncclSend(t.data_ptr(), static_cast<size_t>(t.nbytes()), ncclUint8, peer, comm, stream));
    });
  }
  WorkPtr recv_async(const Tensor& t, int peer) {
    check_tensor("recv", t);
    RT_CHECK(peer >= 0 && peer < size_ && peer != rank_, "nccl recv on rank ", rank_, ": no peer ", peer);
    return launch("recv", t, {t}, [&](ncclComm_t comm, cudaStream_t stream) {
      if (t.nbytes() > 0)
        NCCL_CHECK_PENDING(ncclRecv(t.data_ptr(), static_cast<size_t>(t.nbytes()), ncclUint8, peer, comm, stream));
    });
  }

 private:
  void init(const CommOptions& options) {
    RT_CHECK(options.timeout.count() > 0, "CommOptions.timeout must be positive, got ", options.timeout.count(), " ms");
    state_ = std::make_shared<NcclState>();
    state_->rank = rank_;
    state_->timeout = options.timeout;

    // Local preparation; any rank's failure is every rank's error (rank 0 failing before the broadcast
    // would otherwise leave the others waiting in MPI_Bcast).
    std::string local_error;
    ncclUniqueId id{};
    try {
      if (!cuda_available()) {
        const CudaStatus& status = cuda_status();
        RT_THROW("no usable CUDA device (", status.reason.empty() ? "none visible" : status.reason, ")");
      }
      int index = 0;
      CUDA_CHECK(cudaGetDevice(&index));
      device_ = Device::cuda(index);
      stream_ = Stream::create(device_);
      {
        DeviceGuard guard(device_.index);
        barrier_buffer_ = Tensor::zeros(Shape{1}, DType::I32, device_);
      }
      if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    } catch (const std::exception& e) {
      local_error = e.what();
    }
    agree_or_throw(comm_, local_error, "creating the nccl communicator");
    MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, comm_));

    ncclComm_t comm = nullptr;
    std::string init_error;
    try {
      comm = create_nccl_comm(id);
    } catch (const std::exception& e) {
      init_error = e.what();
    }
    try {
      agree_or_throw(comm_, init_error, "creating the nccl communicator");
    } catch (...) {
      if (comm != nullptr) NCCL_CHECK_PENDING_NOTHROW(ncclCommAbort(comm));
      throw;
    }
    state_->comm = comm;
  }

  // ncclCommInitRankConfig on device_, non-blocking, polled until ready; aborts and raises on an error
  // or at the timeout.
  ncclComm_t create_nccl_comm(const ncclUniqueId& id) {
    DeviceGuard guard(device_.index);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const auto deadline = Clock::now() + state_->timeout;
    ncclResult_t settled = ncclSuccess;
    try {
      // NCCL nulls `comm` when it fails before creating the communicator.
      NCCL_CHECK_PENDING(ncclCommInitRankConfig(&comm, size_, id, rank_, &config));
      settled = settle(comm, deadline);
    } catch (const std::exception& e) {
      if (comm != nullptr) NCCL_CHECK_PENDING_NOTHROW(ncclCommAbort(comm));
      RT_THROW("ncclCommInitRankConfig on rank ", rank_, " (", device_, ") failed: ", e.what());
    }
    if (settled == ncclSuccess) return comm;
    const std::string why =
        settled == ncclInProgress
            ? detail::str_cat("did not finish within ", state_->timeout.count(),
                              " ms (a peer is probably dead or stuck, or the ranks cannot reach each other)")
            : detail::str_cat("failed: ", nccl_failure(comm, settled));
    NCCL_CHECK_PENDING_NOTHROW(ncclCommAbort(comm));
    RT_THROW("ncclCommInitRankConfig on rank ", rank_, " (", device_, ") ", why, "; communicator aborted");
  }

  // Defined, on the GPU, on this communicator's device; errors name the operation, tensor and rank.
  void check_tensor(const char* op, const Tensor& t) const {
    check_collective_tensor(op, t, rank_);
    if (t.device().is_cpu()) {
      RT_THROW("nccl ", op, " on rank ", rank_, ": ", t.describe(),
               " is a CPU tensor; the nccl backend moves GPU tensors only (use --backend ring for CPU tensors)");
    }
    if (t.device() != device_) {
      RT_THROW("nccl ", op, " on rank ", rank_, ": ", t.describe(), " is not on the communicator's device ", device_,
               " (the device current when it was created)");
    }
  }

  // Orders after the caller's stream, enqueues `enqueue(comm, stream)` in a group on our stream, waits
  // for the launch to settle and returns a handle on a completion event. Holds the state mutex.
  template <typename Enqueue>
  WorkPtr launch(const char* op, const Tensor& named, std::vector<Tensor> keep, Enqueue&& enqueue) {
    std::string what = detail::str_cat("nccl ", op, "(", named.describe(), ")");
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->aborted.load()) {
      RT_THROW(what, " on rank ", rank_, ": the communicator was aborted earlier (", state_->abort_reason,
               "); no further operations are possible on it");
    }
    RT_CHECK(state_->comm != nullptr && !closed_, what, " on rank ", rank_, ": the communicator is closed");
    state_->reap_locked();
    const Stream caller = current_stream();
    RT_CHECK(caller.handle() == nullptr || caller.device() == device_, what, " on rank ", rank_,
             ": the current stream is on ", caller.device(), ", not on the communicator's device ", device_);
    const auto deadline = Clock::now() + state_->timeout;
    Event done;
    ncclResult_t settled = ncclSuccess;
    try {
      DeviceGuard guard(device_.index);  // the legacy default stream is the current device's
      Event ready = Event::create(device_);
      ready.record(caller);
      ready.wait_on(stream_);
      {
        NcclGroup group;
        enqueue(state_->comm, as_stream(stream_));
        group.end();
      }
      settled = settle(state_->comm, deadline);
      if (settled == ncclSuccess) {
        done = Event::create(device_);
        done.record(stream_);
      }
    } catch (const std::exception& e) {
      RT_THROW(what, " failed on rank ", rank_, ": ", e.what());
    }
    if (settled != ncclSuccess) {
      const std::string text =
          settled == ncclInProgress
              ? detail::str_cat(what, " on rank ", rank_, " timed out after ", state_->timeout.count(),
                                " ms while launching: a peer is probably dead or stuck; communicator aborted")
              : detail::str_cat(what, " failed on rank ", rank_, ": ", nccl_failure(state_->comm, settled),
                                "; communicator aborted");
      state_->abort_locked(text);
      throw Error(text);
    }
    return std::make_shared<NcclWork>(state_, std::move(what), std::move(done), std::move(keep), deadline);
  }

  // Drains our stream, finalizes and destroys the NCCL communicator, bounded by the timeout; aborts it
  // instead when that fails. Returns the failure ("" when clean); never throws.
  std::string shutdown() noexcept {
    if (!state_) return "";
    std::lock_guard<std::mutex> lock(state_->mutex);
    const ncclComm_t comm = state_->comm;
    if (comm == nullptr) return "";  // aborted (or never made)
    try {
      DeviceGuard guard(device_.index);
      const auto deadline = Clock::now() + state_->timeout;
      bool idle = stream_idle(stream_);
      while (!idle && Clock::now() < deadline) {
        std::this_thread::sleep_for(kPollInterval);
        idle = stream_idle(stream_);
      }
      RT_CHECK(idle, "its stream did not drain within ", state_->timeout.count(), " ms");
      state_->orphans.clear();  // the stream is idle: every operation has finished
      NCCL_CHECK_PENDING(ncclCommFinalize(comm));
      const ncclResult_t settled = settle(comm, deadline);
      RT_CHECK(settled == ncclSuccess, "ncclCommFinalize ",
               settled == ncclInProgress ? detail::str_cat("did not finish within ", state_->timeout.count(), " ms")
                                         : nccl_failure(comm, settled));
      state_->comm = nullptr;  // freed by the call below whatever it answers
      NCCL_CHECK_PENDING(ncclCommDestroy(comm));
      return "";
    } catch (const std::exception& e) {
      state_->abort_locked("the communicator was shut down after a failure");
      return e.what();
    } catch (...) {
      state_->abort_locked("the communicator was shut down after a failure");
      return "unknown error";
    }
  }

  std::shared_ptr<NcclState> state_;
  Device device_;
  Stream stream_;          // non-blocking, ours alone
  Tensor barrier_buffer_;  // one i32 on device_, all-reduced by barrier()
  bool closed_ = false;
};

}  // namespace

namespace {

// One direction of a pipeline's messages: a NCCL communicator (and stream) of its own, so the other
// direction's queued operations never hold this one up.
class NcclChannel final : public Channel {
 public:
  NcclChannel(MPI_Comm parent, std::string name, std::chrono::milliseconds timeout) : name_(std::move(name)) {
    CommOptions options;
    options.timeout = timeout;
    comm_ = std::make_unique<NcclCommunicator>(parent, options);
  }
  ~NcclChannel() override {
    if (comm_) comm_->release_local();
  }
  WorkPtr send(const Tensor& t, int peer) override { return comm_->send_async(t, peer); }
  WorkPtr recv(const Tensor& t, int peer) override { return comm_->recv_async(t, peer); }
  void close() override { comm_->close(); }
  const std::string& name() const override { return name_; }

 private:
  std::string name_;
  std::unique_ptr<NcclCommunicator> comm_;
};

}  // namespace

std::unique_ptr<Channel> make_nccl_channel(MPI_Comm parent, const std::string& name,
                                           std::chrono::milliseconds timeout) {
  return std::make_unique<NcclChannel>(parent, name, timeout);
}

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm parent, const CommOptions& options) {
  return std::make_unique<NcclCommunicator>(parent, options);
}

}  // namespace ringtrain::comm
