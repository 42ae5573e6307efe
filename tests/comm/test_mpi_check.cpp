// Runs under mpirun with 2 ranks: MPI_CHECK turns a failing MPI call into ringtrain::Error with the
// call text and MPI's own explanation, on every rank, and a good collective passes through.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi_check.h"
#include "core/check.h"

namespace ringtrain {
namespace {

TEST(MpiCheck, FailingCallBecomesAnErrorWithCallTextAndMpiText) {
  MPI_Comm comm;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = -1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  try {
    int value = 1;
    MPI_CHECK(MPI_Bcast(&value, 1, MPI_INT, 99, comm));  // root 99 does not exist
    FAIL() << "no exception on rank " << rank;
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("MPI error"), std::string::npos) << w;
    EXPECT_NE(w.find("MPI_Bcast(&value, 1, MPI_INT, 99, comm)"), std::string::npos) << w;
    EXPECT_NE(w.find("root"), std::string::npos) << w;
  }
  int sum = 0, one = 1;
  MPI_CHECK(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, comm));
  EXPECT_EQ(sum, 2);
  MPI_CHECK(MPI_Comm_free(&comm));
}

}  // namespace
}  // namespace ringtrain
