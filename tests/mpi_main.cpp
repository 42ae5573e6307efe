// tests/mpi_main.cpp: main() of the multi-rank suites (add_mpi_test): every rank runs every test, and
// the job's exit status is the worst rank's, so one failing rank fails the CTest entry. MPI starts the
// way apps start it (comm::World, MPI_THREAD_MULTIPLE) so the communication threads are exercised.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/world.h"

int main(int argc, char** argv) {
  ringtrain::comm::World::init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int result = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;  // MPI is finalised at exit
}
