// comm/world.h: the MPI world of a ringtrain process.
//
// World::init starts MPI with MPI_THREAD_MULTIPLE (the communication threads of the CPU backends call MPI
// while the main thread may run its own collectives, e.g. SyncBatchNorm) and learns rank, size, local
// rank and local size (MPI_Comm_split_type SHARED), node count and host names. A program started
// without mpirun is a valid 1-rank world. MPI is finalised at exit.
//
// run_main is the entry point apps use: an exception on any rank prints "rank R (host): message" once
// and aborts the whole job (MPI_Abort), so no rank is left waiting in a collective for a dead peer.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/parallel.h"

namespace ringtrain::comm {

// World::bind refuses more CPU threads than this many per core available to the process.
using ringtrain::kMaxThreadsPerCore;

struct DeviceBinding {
  Device device = Device::cpu();
  int threads = 1;          // CPU threads for this rank's kernels
  std::string description;  // "rank 1 -> cuda:1 (local rank 1 of 2)"
};

class World {
 public:
  // Initialises MPI once (later calls return the same world). With MPI already initialised by someone
  // else, adopts it (its thread level is what it is; the CPU backends then run without a thread when
  // it is below MPI_THREAD_MULTIPLE).
  static World& init(int* argc = nullptr, char*** argv = nullptr);
  static bool initialized();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int num_nodes() const { return num_nodes_; }
  // Every node holds the same number of ranks (what the hierarchical all-reduce needs).
  bool nodes_uniform() const { return nodes_uniform_; }
  const std::string& host() const { return hosts_[rank_]; }
  const std::vector<std::string>& hosts() const { return hosts_; }  // per rank
  int thread_level() const { return thread_level_; }
  bool is_root() const { return rank_ == 0; }
  MPI_Comm comm() const { return comm_; }  // a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN

  // Binds this rank: `want` cpu, or cuda (any index: the GPU is local_rank % device_count). More local
  // ranks than GPUs is an error naming both counts unless `allow_shared_gpu`. threads <= 0 means the
  // cores this process may use / local ranks (at least 1). Sets the device and the CPU thread count.
  // `chosen` >= 0: that CUDA index (runtime/cluster/gpu_choice.h chose it by occupancy) instead of local_rank % count.
  DeviceBinding bind(Device want, int threads = 0, bool allow_shared_gpu = false, int chosen = -1) const;

  // Prints "ringtrain: rank R (host): message" to stderr and aborts every rank of the job. `permanent`:
  // no restart fixes it (Error::permanent); the exit status is then kExitPermanent and, under a
  // supervisor, the error event says so.
  [[noreturn]] void abort(const std::string& message, int code = 1, bool permanent = false) const;

  // "rank 0 of 2 (local 0 of 2) on host"
  std::string describe() const;

 private:
  World() = default;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, num_nodes_ = 1;
  bool nodes_uniform_ = true;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::vector<std::string> hosts_{""};
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// The exit status of a job that failed for a reason no restart fixes (bad flags, data, checkpoint).
inline constexpr int kExitPermanent = 3;

// Under the supervisor (apps/ringtrain_run sets RINGTRAIN_SUPERVISOR=1 for every rank) the job reports
// what the supervisor acts on as lines "ringtrain-event {JSON object}": rank 0 its plan, every step and
// every checkpoint (stdout), any failing rank its error and whether it is permanent (stderr). Outside a
// supervisor nothing is printed.
inline constexpr const char* kEventPrefix = "ringtrain-event ";
bool supervised();
// Prints kEventPrefix + json_object as one line and flushes (stderr or stdout); nothing when not supervised.
void supervisor_event(const std::string& json_object, bool to_stderr = false);
// `text` as a JSON string literal (quotes, backslashes and control characters escaped).
std::string json_quote(const std::string& text);

// Initialises the world, runs fn, returns its exit code. Any exception escaping fn (or a
// ringtrain::Error from any rank) prints once, naming rank and host, and aborts the job with status 1
// (kExitPermanent for a permanent Error).
int run_main(int argc, char** argv, const std::function<int(World&)>& fn);
// The same, where an allocation that fails is followed by `memory_hint`: what the program's own flags can do
// about it ("a smaller -b ..."), as "; to use less memory: ...".
int run_main(int argc, char** argv, const char* memory_hint, const std::function<int(World&)>& fn);

}  // namespace ringtrain::comm
