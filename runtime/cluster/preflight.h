// runtime/cluster/preflight.h: the checks that tell, before any training time is spent, whether a job can run:
// the same build and libraries on every rank, a small model that learns on every device, a checked and
// timed all-reduce per backend, and a dataset that validates. ringtrain_env runs them all and prints the
// machine facts; train_resnet --check (Trainer: TrainerOptions::check) runs the quick pair (same build, the
// run's all-reduce) and stops the job naming the failing ranks. Every check is collective.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.h"
#include "comm/world.h"
#include "core/device.h"

namespace ringtrain::runtime {

// "ringtrain 0.1.0 (CUDA built in); CUDA runtime ..., cuDNN ..., NCCL ...; Open MPI ...; HDF5 ...;
// OpenBLAS ...; oneDNN ..., built <date time>". RINGTRAIN_FAKE_BUILD=X appends " [X]" (tests).
std::string build_identity();
// The machine facts of this host: CPU, cores, memory, GPUs (what ringtrain_env prints per host).
std::string host_report(const comm::World& world);

// Each returns this rank's failure ("" when it passed); `detail` gets what to print on success.
std::string check_same_build(const comm::World& world);
std::string check_self_test(Device device, std::string& detail);
struct AllReduceCheck {
  std::string failure;
  double busbw_gbs = 0;  // the slowest rank's
};
// `bytes` of f32 reduced once and checked, then timed over `repeats` (collective; the same on every rank).
AllReduceCheck check_all_reduce(const comm::World& world, comm::Backend backend, Device device, int64_t bytes,
                                int repeats = 5);
// Every split of `dir` opens and validates; encoded records are decoded (as the loader will) and checked
// against their shape (the split's, or their /shapes row): a sample of each shard (its first, last and
// evenly spread records, kDecodeSample in all), or every record with `decode_all`. A record that does not
// decode, decodes to another shape, or decodes only with libjpeg warnings fails the check, named.
constexpr int64_t kDecodeSample = 16;
std::string check_data(const std::string& dir, std::string& detail, bool decode_all = false);

// Collective: every rank's verdict; rank 0 prints "PASS name: pass_detail" or "FAIL name:" and one line
// per failing rank ("  rank R (host): reason"). Returns whether every rank passed (the same everywhere).
bool report_check(const comm::World& world, const std::string& name, const std::string& local_failure,
                  const std::string& pass_detail);

// The in-run preflight: same build, and a checked 16 MiB all-reduce on `backend`. Rank 0 prints one line;
// a failure is a CollectiveError naming the ranks.
void quick_preflight(const comm::World& world, comm::Backend backend, Device device);

}  // namespace ringtrain::runtime
