// comm/communicator.h: one interface for the collectives every backend offers.
//
// Backends (chosen by make_communicator, implemented in separate files):
//   ring  our own ring all-reduce over MPI point-to-point for CPU tensors (comm/ring.cpp): reduce-scatter
//         then all-gather, chunked and pipelined; GPU tensors go through pinned host buffers.
//   mpi   MPI_Allreduce and friends, the reference (comm/mpi_backend.cpp).
//   nccl  NCCL for GPU tensors (comm/nccl.cpp, CUDA builds only).
//
// Every operation is asynchronous and ordered: operations run in submission order, so ranks that submit
// the same sequence (as GradSync does) match up. Blocking forms are wait() on the returned handle.
// Tensors are used in place and must stay alive until the handle completes (the handle keeps them).
// Errors (a failed MPI/NCCL call, a timeout) are raised by wait() naming the operation and rank.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"

namespace ringtrain::comm {

enum class ReduceOp : uint8_t { Sum, Average };
enum class Backend : uint8_t { Ring, Mpi, Nccl };

// "ring" | "mpi" | "nccl"; anything else is an error naming the value.
Backend parse_backend(const std::string& name);
const char* backend_name(Backend b);

// Handle of an asynchronous collective.
class Work {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Work() = default;
  virtual void wait() = 0;  // blocks until done; rethrows the operation's error
  virtual bool test() = 0;  // true once complete (an error is raised by wait(), not here)
  // When the operation ran (began and ended on the communication thread), once complete; backends that
  // cannot tell (NCCL runs on the device) return false.
  virtual bool ran(TimePoint& begin, TimePoint& end) {
    (void)begin;
    (void)end;
    return false;
  }
};
using WorkPtr = std::shared_ptr<Work>;

struct CommOptions {
  // Ring: bytes per pipelined message. Large enough to amortise per-message cost, small enough that
  // reducing one chunk overlaps receiving the next.
  int64_t chunk_bytes = 512 << 10;
  // Ring: receive buffers in flight per rank (the pipeline depth).
  int pipeline_depth = 4;
  // NCCL: how long a collective may run before the communicator is aborted and wait() raises.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual Backend backend() const = 0;
  // The private MPI communicator this one uses (a duplicate of the parent given at creation).
  MPI_Comm mpi_comm() const { return comm_; }

  // In place over all ranks. Floating dtypes (f32, f64, bf16, f16) and i32/i64 (sum only).
  virtual WorkPtr all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // Root's values into every rank's `t` (same shape and dtype everywhere).
  virtual WorkPtr broadcast_async(const Tensor& t, int root = 0) = 0;
  // out (size * in.numel() elements) = every rank's `in`, concatenated in rank order.
  virtual WorkPtr all_gather_async(const Tensor& in, const Tensor& out) = 0;
  // in (size * out.numel() elements): out = block `rank` of the reduction of every rank's `in`.
  virtual WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::Sum) = 0;
  virtual void barrier() = 0;

  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op)->wait(); }
  void broadcast(const Tensor& t, int root = 0) { broadcast_async(t, root)->wait(); }
  void all_gather(const Tensor& in, const Tensor& out) { all_gather_async(in, out)->wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, op)->wait();
  }

 protected:
  explicit Communicator(MPI_Comm parent);  // duplicates parent, sets MPI_ERRORS_RETURN
  void free_comm() noexcept;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};
using CommunicatorPtr = std::shared_ptr<Communicator>;

// A communicator of the given backend over `parent` (collective over parent: every rank must call it).
CommunicatorPtr make_communicator(Backend backend, MPI_Comm parent = MPI_COMM_WORLD,
                                  const CommOptions& options = {});

// Shape/dtype/count checks shared by the backends; errors name the operation, tensor and rank.
void check_collective_tensor(const char* op, const Tensor& t, int rank);

// Collective over `comm`: every rank's string, in rank order, on `root` (an empty vector elsewhere).
std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int root = 0);

// An error every rank raises identically (a collective verdict): run_main prints it once, from rank 0.
class CollectiveError : public ::ringtrain::Error {
 public:
  using ::ringtrain::Error::Error;
};

// A collective verdict: every rank passes its local error text ("" when fine); if any rank has one,
// every rank throws the same CollectiveError naming the failing rank(s) and their texts. Use it
// before anything that would otherwise leave healthy ranks waiting for a failed one.
void agree_or_throw(MPI_Comm comm, const std::string& local_error, const std::string& what);

}  // namespace ringtrain::comm
