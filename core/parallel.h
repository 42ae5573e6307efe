// core/parallel.h: how every CPU kernel uses threads: parallel_for over OpenMP's worker threads, the same
// ones oneDNN's convolutions run on. Their number is this process's share of the
// cores: cores available to the process / ranks on this node (from the launcher's environment), so
// `mpirun -np 2` on 2 cores does not oversubscribe. set_num_threads (later `--threads`) overrides it
// and also sets OpenBLAS's thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

namespace ringtrain {

int num_threads();
void set_num_threads(int n);
// RINGTRAIN_THREADS: the thread count when no --threads is given (0 to kMaxThreads, refused naming the
// variable otherwise); nullopt when unset, empty or 0 (automatic, as --threads 0).
constexpr int kMaxThreads = 1024;
// More threads than this many per core available only thrash: compute threads (World::bind) and loader
// threads (data::Loader) beyond it are refused, naming the flag.
constexpr int kMaxThreadsPerCore = 16;
std::optional<int> threads_from_env();
// Cores usable by this process (sched_getaffinity) and ranks on this node (OMPI/MPICH/Slurm env; 1).
int available_cores();
int local_ranks_from_env();

// Splits [0, n) into chunks of at least `grain` and runs fn(begin, end) on the worker threads (the caller
// takes part). Runs inline when n <= grain, with one thread, or when called from inside a parallel region
// (a nested call, or from inside a oneDNN/OpenMP task). Several host threads may call it at once (each
// gets its own OpenMP team, so together they may oversubscribe the cores). The count applies to the
// calling thread's oneDNN work via omp_set_num_threads, which is per thread: set it on the thread that
// runs the model.
// Exceptions thrown by fn are rethrown in the caller (the first one).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace ringtrain
