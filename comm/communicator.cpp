// comm/communicator.cpp: the parts of Communicator every backend shares, the factory, and the
// collective verdict (agree_or_throw).
#include "comm/communicator.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/backends.h"
#include "core/check.h"

namespace ringtrain::comm {

Backend parse_backend(const std::string& name) {
  if (name == "ring") return Backend::Ring;
  if (name == "mpi") return Backend::Mpi;
  if (name == "nccl") return Backend::Nccl;
  RT_THROW("unknown communication backend '", name, "' (expected ring, mpi or nccl)");
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Ring: return "ring";
    case Backend::Mpi: return "mpi";
    case Backend::Nccl: return "nccl";
  }
  return "?";
}

Communicator::Communicator(MPI_Comm parent) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  RT_CHECK(initialized, "a communicator needs MPI: call comm::World::init first");
  MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

void Communicator::free_comm() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

CommunicatorPtr make_communicator(Backend backend, MPI_Comm parent, const CommOptions& options) {
  RT_CHECK(options.chunk_bytes >= 64 && options.chunk_bytes <= (int64_t{1} << 30),
           "chunk size (CommOptions.chunk_bytes, --chunk-bytes) must be between 64 bytes and 1 GiB, got ",
           options.chunk_bytes);
  RT_CHECK(options.pipeline_depth >= 1, "CommOptions.pipeline_depth must be at least 1, got ",
           options.pipeline_depth);
  switch (backend) {
    case Backend::Ring: return make_ring_communicator(parent, options);
    case Backend::Mpi: return make_mpi_communicator(parent, options);
    case Backend::Nccl: return make_nccl_communicator(parent, options);
  }
  RT_THROW("make_communicator: bad backend");
}

std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int root) {
  int size = 1, rank = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(size), displs(size, 0);
  MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm));
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += rank == root ? lengths[r] : 0;
  }
  std::vector<char> all(static_cast<size_t>(std::max(total, 1)));
  MPI_CHECK(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR, root, comm));
  std::vector<std::string> out;
  if (rank == root)
    for (int r = 0; r < size; ++r) out.emplace_back(all.data() + displs[r], static_cast<size_t>(lengths[r]));
  return out;
}

void agree_or_throw(MPI_Comm comm, const std::string& local_error, const std::string& what) {
  int size = 1, rank = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const int mine = static_cast<int>(local_error.size());
  std::vector<int> lengths(size);
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm));
  std::vector<int> displs(size, 0);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += lengths[r];
  }
  if (total == 0) return;
  std::vector<char> all(total);
  MPI_CHECK(MPI_Allgatherv(local_error.data(), mine, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR,
                           comm));
  std::string message = what + " failed on ";
  std::string details;
  int failed = 0;
  for (int r = 0; r < size; ++r) {
    if (lengths[r] == 0) continue;
    message += detail::str_cat(failed++ ? ", rank " : "rank ", r);
    if (failed <= 4) details += detail::str_cat("\n  rank ", r, ": ", std::string(all.data() + displs[r], lengths[r]));
  }
  if (failed > 4) details += detail::str_cat("\n  (", failed - 4, " more ranks failed)");
  throw CollectiveError(message + details);
}

}  // namespace ringtrain::comm
