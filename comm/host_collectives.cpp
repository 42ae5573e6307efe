// comm/host_collectives.cpp: host-value collectives and the collective verdict (agree_or_throw).
#include "comm/host_collectives.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "comm/mpi_check.h"
#include "comm/polite_wait.h"

namespace ringtrain::comm {
namespace {

MPI_Op mpi_op(HostOp op) {
  switch (op) {
    case HostOp::Sum:
      return MPI_SUM;
    case HostOp::Min:
      return MPI_MIN;
    case HostOp::Max:
      return MPI_MAX;
  }
  return MPI_SUM;
}

int rank_of(MPI_Comm comm) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  return rank;
}

int size_of(MPI_Comm comm) {
  int size = 1;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  return size;
}

// Runs the non-blocking collective `start` posts and waits for it politely (polite_wait.h): a rank
// waiting for a slower one (the step's check-in) leaves the cores to those still computing. Its rounds
// advance only inside each rank's MPI_Test, and a rank that waited long may be asleep at each: the
// longest pause is cut so that all of them (2 log2 p: a reduce, then a broadcast) add at most 1 ms.
template <typename Start>
void run_politely(MPI_Comm comm, const char* what, Start start) {
  int rounds = 2;
  for (int p = size_of(comm); p > 2; p = (p + 1) / 2) rounds += 2;
  MPI_Request request = MPI_REQUEST_NULL;
  start(&request);
  try {
    wait_politely(&request, MPI_STATUS_IGNORE,
                  std::max(std::chrono::microseconds(50), std::chrono::microseconds(1000) / rounds));
  } catch (const Error& e) {
    RT_THROW(what, ": ", e.what());
  }
}

int checked_count(size_t n, const char* what) {
  RT_CHECK(n <= static_cast<size_t>(std::numeric_limits<int>::max()), what, ": ", n,
           " elements exceed MPI's int count");
  return static_cast<int>(n);
}

// Displacements of a gather of `lengths`; returns the total.
int displacements(const std::vector<int>& lengths, std::vector<int>& displs) {
  displs.assign(lengths.size(), 0);
  int64_t total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    displs[r] = static_cast<int>(total);
    total += lengths[r];
  }
  RT_CHECK(total <= std::numeric_limits<int>::max(), "gathering ", total, " bytes of strings exceeds MPI's int count");
  return static_cast<int>(total);
}

}  // namespace

void all_reduce(MPI_Comm comm, std::span<double> values, HostOp op) {
  const int n = checked_count(values.size(), "all_reduce");
  run_politely(comm, "all_reduce", [&](MPI_Request* r) {
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values.data(), n, MPI_DOUBLE, mpi_op(op), comm, r));
  });
}

void all_reduce(MPI_Comm comm, std::span<int64_t> values, HostOp op) {
  const int n = checked_count(values.size(), "all_reduce");
  run_politely(comm, "all_reduce", [&](MPI_Request* r) {
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values.data(), n, MPI_INT64_T, mpi_op(op), comm, r));
  });
}

void all_reduce(MPI_Comm comm, std::span<uint64_t> values, HostOp op) {
  const int n = checked_count(values.size(), "all_reduce");
  run_politely(comm, "all_reduce", [&](MPI_Request* r) {
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values.data(), n, MPI_UINT64_T, mpi_op(op), comm, r));
  });
}

double all_reduce(MPI_Comm comm, double value, HostOp op) {
  all_reduce(comm, std::span<double>(&value, 1), op);
  return value;
}

int64_t all_reduce(MPI_Comm comm, int64_t value, HostOp op) {
  all_reduce(comm, std::span<int64_t>(&value, 1), op);
  return value;
}

bool same_on_every_rank(MPI_Comm comm, std::span<const int64_t> values) {
  std::vector<int64_t> v;
  v.reserve(2 * values.size());
  for (int64_t x : values) {
    RT_CHECK(x != std::numeric_limits<int64_t>::min(), "same_on_every_rank: INT64_MIN has no negation");
    v.push_back(x);
    v.push_back(-x);
  }
  all_reduce(comm, std::span<int64_t>(v), HostOp::Min);
  for (size_t i = 0; i < values.size(); ++i)
    if (v[2 * i] != values[i] || -v[2 * i + 1] != values[i]) return false;
  return true;
}

std::string broadcast(MPI_Comm comm, const std::string& value, int root) {
  int64_t length = static_cast<int64_t>(value.size());
  MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT64_T, root, comm));
  std::string out = rank_of(comm) == root ? value : std::string(static_cast<size_t>(length), '\0');
  MPI_CHECK(MPI_Bcast(out.data(), checked_count(static_cast<size_t>(length), "broadcast"), MPI_CHAR, root, comm));
  return out;
}

int64_t broadcast(MPI_Comm comm, int64_t value, int root) {
  MPI_CHECK(MPI_Bcast(&value, 1, MPI_INT64_T, root, comm));
  return value;
}

std::vector<double> gather(MPI_Comm comm, std::span<const double> mine, int root) {
  const int n = checked_count(mine.size(), "gather");
  std::vector<double> all(rank_of(comm) == root ? mine.size() * static_cast<size_t>(size_of(comm)) : 0);
  MPI_CHECK(MPI_Gather(mine.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, root, comm));
  return all;
}

std::vector<int64_t> all_gather(MPI_Comm comm, std::span<const int64_t> mine) {
  const int n = checked_count(mine.size(), "all_gather");
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(size_of(comm)));
  MPI_CHECK(MPI_Allgather(mine.data(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, comm));
  return all;
}

std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int root) {
  const int size = size_of(comm), rank = rank_of(comm);
  const int length = checked_count(mine.size(), "gather_strings");
  std::vector<int> lengths(static_cast<size_t>(size)), displs;
  MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm));
  // Only the root's lengths are real; elsewhere they are zeros and nothing is received.
  const int total = displacements(lengths, displs);
  std::vector<char> all(static_cast<size_t>(std::max(total, 1)));
  MPI_CHECK(
      MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR, root, comm));
  std::vector<std::string> out;
  if (rank == root)
    for (int r = 0; r < size; ++r) out.emplace_back(all.data() + displs[r], static_cast<size_t>(lengths[r]));
  return out;
}

std::vector<std::string> all_gather_strings(MPI_Comm comm, const std::string& mine) {
  const int size = size_of(comm);
  const int length = checked_count(mine.size(), "all_gather_strings");
  std::vector<int> lengths(static_cast<size_t>(size)), displs;
  MPI_CHECK(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm));
  const int total = displacements(lengths, displs);
  std::vector<char> all(static_cast<size_t>(std::max(total, 1)));
  MPI_CHECK(MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR, comm));
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.emplace_back(all.data() + displs[r], static_cast<size_t>(lengths[r]));
  return out;
}

void barrier(MPI_Comm comm) { MPI_CHECK(MPI_Barrier(comm)); }

std::string failure_of(const std::function<void()>& work) {
  try {
    work();
  } catch (const std::exception& e) {
    const std::string text = e.what();
    return text.empty() ? std::string("an error without a message") : text;
  }
  return "";
}

void agree_or_throw(MPI_Comm comm, const std::string& local_error, const std::string& what, bool permanent) {
  const int64_t failing = all_reduce(comm, int64_t{local_error.empty() ? 0 : 1});
  if (failing == 0) return;
  const std::vector<std::string> all = all_gather_strings(comm, local_error);
  std::string message = what + " failed on ";
  std::string details;
  int failed = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    message += detail::str_cat(failed++ ? ", rank " : "rank ", r);
    if (failed <= 4) details += detail::str_cat("\n  rank ", r, ": ", all[r]);
  }
  if (failed > 4) details += detail::str_cat("\n  (", failed - 4, " more ranks failed)");
  throw CollectiveError(message + details, permanent);
}

}  // namespace ringtrain::comm
