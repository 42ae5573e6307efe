// comm/communicator.h: one interface for the collectives every backend offers.
//
// Backends (chosen by make_communicator, implemented in separate files):
//   ring  our own ring all-reduce over MPI point-to-point for CPU tensors (comm/ring.cpp): reduce-scatter
//         then all-gather, chunked and pipelined; GPU tensors go through pinned host buffers.
//   hierarchical  the ring, node-aware (comm/ring.cpp): reduce-scatter inside each node over shared memory,
//         an all-reduce of each local rank's slice across nodes, an all-gather inside the node; the
//         automatic CPU choice when ranks share nodes across several nodes (auto_backend).
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
#include <utility>
#include <vector>

#include "comm/host_collectives.h"
#include "core/check.h"
#include "core/tensor.h"

namespace ringtrain::comm {

enum class ReduceOp : uint8_t { Sum, Average };
enum class Backend : uint8_t { Ring, Mpi, Nccl, Hierarchical };

// "ring" | "hierarchical" | "mpi" | "nccl"; anything else is an error naming the value.
Backend parse_backend(const std::string& name);
const char* backend_name(Backend b);

class World;
// What `--backend auto` means for this world and device: nccl for GPU tensors; on the CPU hierarchical
// when several nodes each hold the same number (> 1) of ranks, else ring.
Backend auto_backend(const World& world, Device device);

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
  // Ring, between nodes: bytes per message and receives in flight when a ring's neighbours are on other
  // nodes. Below Open MPI's TCP eager limit (64 KiB with its header), so no message waits for a rendezvous
  // reply queued behind data on a saturated link.
  int64_t net_chunk_bytes = 64000;
  int net_pipeline_depth = 16;
  // Hierarchical: ranks per node, counted in rank order (ranks 0..k-1 are node 0, ...), instead of the
  // ranks that share memory; 0 means the real topology. For tests and for emulating nodes on one host.
  int node_size = 0;
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
  // The backend and how it spans the ranks, e.g. "hierarchical: 2 nodes x 2 ranks".
  virtual std::string describe() const;
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

  // The two halves of all_reduce_async, for a sharded optimizer (ZeRO-1), in place and in this backend's
  // own segment ownership, so that the two in sequence give all_reduce's bits exactly (each element is
  // summed in the same order and scaled once, as all_reduce does):
  //   shard(count): the elements [first, second) this rank owns of a buffer of `count` elements (the
  //     ranks' shards partition [0, count); some may be empty);
  //   reduce_scatter_shard_async(t, op): afterwards t's own shard holds the full reduction; the rest of t
  //     is scratch;
  //   all_gather_shard_async(t): every rank's own shard of t to every rank.
  // The ring and hierarchical backends move half an all-reduce's traffic in each; the others reduce
  // everything in the first half and broadcast each shard from its owner in the second.
  virtual std::pair<int64_t, int64_t> shard(int64_t count) const;  // default: even_shard(count, rank, size)
  virtual WorkPtr reduce_scatter_shard_async(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  virtual WorkPtr all_gather_shard_async(const Tensor& t);

  // Collective: waits for every operation submitted so far, then releases what the communicator holds
  // (its thread, its MPI and NCCL communicators); later operations are errors naming the communicator as
  // closed. Call it on every rank at the same point, on the success path. Idempotent.
  virtual void close() = 0;
  // What destruction does instead, for a communicator that was not closed (an error is unwinding): local
  // and bounded, never waiting for a peer. Operations still queued fail with an error; one running is
  // cancelled where the backend can (the ring's waits poll for it; NCCL aborts). Returns false when the
  // object must outlive this call (its thread is inside a blocking MPI call, or MPI may still write into
  // its buffers): the deleter of make_communicator then leaks it on purpose rather than block.
  virtual bool release_local() noexcept = 0;

  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op)->wait(); }
  void broadcast(const Tensor& t, int root = 0) { broadcast_async(t, root)->wait(); }
  void all_gather(const Tensor& in, const Tensor& out) { all_gather_async(in, out)->wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, op)->wait();
  }

 protected:
  explicit Communicator(MPI_Comm parent);  // duplicates parent, sets MPI_ERRORS_RETURN
  void free_comm() noexcept;               // comm_ and sub_comms_
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<MPI_Comm> sub_comms_;  // more private communicators a backend made from comm_
  int rank_ = 0, size_ = 1;
};
using CommunicatorPtr = std::shared_ptr<Communicator>;

// Rank r's part of `count` elements cut evenly among `size` ranks: [count*r/size, count*(r+1)/size).
inline std::pair<int64_t, int64_t> even_shard(int64_t count, int r, int size) {
  return {count * r / size, count * (r + 1) / size};
}

// A communicator of the given backend over `parent` (collective over parent: every rank must call it).
// The last reference going away calls release_local() (never blocks); close() first for a clean end.
CommunicatorPtr make_communicator(Backend backend, MPI_Comm parent = MPI_COMM_WORLD, const CommOptions& options = {});

// Shape/dtype/count checks shared by the backends; errors name the operation, tensor and rank.
void check_collective_tensor(const char* op, const Tensor& t, int rank);

}  // namespace ringtrain::comm
