// comm/host_collectives.h: blocking collectives over a few host values — metrics, flags, strings, verdicts —
// for apps and the runtime, so they never spell raw MPI calls. All take an MPI communicator (World::comm()
// or a Communicator's mpi_comm()), and every rank of it must make the same calls in the same order.
// Failures are ringtrain::Errors naming the MPI call (the communicators use MPI_ERRORS_RETURN).
// Tensors go through a Communicator (comm/communicator.h) instead.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"

namespace ringtrain::comm {

enum class HostOp : uint8_t { Sum, Min, Max };

// In place over all ranks, element by element.
void all_reduce(MPI_Comm comm, std::span<double> values, HostOp op = HostOp::Sum);
void all_reduce(MPI_Comm comm, std::span<int64_t> values, HostOp op = HostOp::Sum);
void all_reduce(MPI_Comm comm, std::span<uint64_t> values, HostOp op);
double all_reduce(MPI_Comm comm, double value, HostOp op = HostOp::Sum);
int64_t all_reduce(MPI_Comm comm, int64_t value, HostOp op = HostOp::Sum);

// Whether every rank passed the same values: one all-reduce (the minimum of each value and of its negation
// gives its minimum and maximum at once). Values must be above INT64_MIN.
bool same_on_every_rank(MPI_Comm comm, std::span<const int64_t> values);

// Root's value on every rank (any length; the other ranks' inputs are ignored).
std::string broadcast(MPI_Comm comm, const std::string& value, int root = 0);
int64_t broadcast(MPI_Comm comm, int64_t value, int root = 0);

// Every rank's values, concatenated in rank order (mine.size() must be the same on every rank); on
// `root` only for gather (an empty vector elsewhere), on every rank for all_gather.
std::vector<double> gather(MPI_Comm comm, std::span<const double> mine, int root = 0);
std::vector<int64_t> all_gather(MPI_Comm comm, std::span<const int64_t> mine);
// Every rank's string, in rank order, on `root` (an empty vector elsewhere) or on every rank.
std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int root = 0);
std::vector<std::string> all_gather_strings(MPI_Comm comm, const std::string& mine);

void barrier(MPI_Comm comm);

// An error every rank raises identically (a collective verdict): run_main prints it once, from rank 0.
class CollectiveError : public ::ringtrain::Error {
 public:
  using ::ringtrain::Error::Error;
};

// A collective verdict: every rank passes its local error text ("" when fine); if any rank has one,
// every rank throws the same CollectiveError naming the failing rank(s) and their texts. Use it
// before anything that would otherwise leave healthy ranks waiting for a failed one. `permanent`: the
// step is about the input (flags, data, a checkpoint), so the verdict is an error no restart fixes.
void agree_or_throw(MPI_Comm comm, const std::string& local_error, const std::string& what, bool permanent = false);
// A rank's local error for agree_or_throw: what `work` throws (its text), "" when it returns. The shape of
// every agreed step: error = failure_of([&] { ...this rank's part... }); agree_or_throw(comm, error, ...).
std::string failure_of(const std::function<void()>& work);

}  // namespace ringtrain::comm
