// Runs under mpirun with 2 ranks: MPI_CHECK turns a failing MPI call into ringtrain::Error with the
// call text and MPI's own explanation, on every rank, and a good collective passes through; the polite
// wait (comm/polite_wait.h) on a request and on any condition.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <vector>

#include "comm/mpi_check.h"
#include "comm/polite_wait.h"
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

using us = std::chrono::microseconds;

TEST(PoliteWait, PausesDoubleToAHundredMicrosecondsThenGrowWithTheTimeSleptUpToTheCap) {
  std::vector<long> seen;
  us pause(10), slept(0);
  for (int i = 0; i < 12; ++i) {
    seen.push_back(static_cast<long>(pause.count()));
    slept += pause;
    pause = comm::next_polite_pause(pause, slept, us(1000));
  }
  // 10, 20, 40, 80, 100, then a quarter of the time slept so far (noticed at most 25% late), at most 1 ms.
  const std::vector<long> want = {10, 20, 40, 80, 100, 100, 100, 112, 140, 175, 219, 274};
  EXPECT_EQ(seen, want);
  EXPECT_EQ(comm::next_polite_pause(us(800), us(100000), us(1000)), us(1000));
  EXPECT_EQ(comm::next_polite_pause(us(150), us(100000), us(200)), us(200));
}

TEST(PoliteWait, AConditionIsPolledUntilTrueAndACancelInTheSleepEndsTheWait) {
  // True at once: no sleep, no before_sleep.
  int polls = 0, sleeps = 0;
  comm::wait_politely_until([&] { return ++polls >= 1; }, us(200), [&] { ++sleeps; });
  EXPECT_EQ(polls, 1);
  EXPECT_EQ(sleeps, 0);
  // After the 64 spins and the 256 yields: it sleeps, and is polled after each sleep until true.
  polls = 0;
  comm::wait_politely_until([&] { return ++polls > 64 + 256 + 3; }, us(200), [&] { ++sleeps; });
  EXPECT_EQ(polls, 64 + 256 + 4);
  EXPECT_EQ(sleeps, 4);
  // A cancel thrown before a sleep ends the wait with it.
  polls = 0;
  EXPECT_THROW(
      comm::wait_politely_until([&] { return ++polls < 0; }, us(200), [] { throw Error("cancelled by the test"); }),
      Error);
  EXPECT_EQ(polls, 64 + 256);
}

TEST(PoliteWait, ARequestIsWaitedForUntilItsMessageArrives) {
  int rank = -1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  int value = rank == 0 ? 42 : 0;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Status status;
  if (rank == 0) {
    MPI_CHECK(MPI_Isend(&value, 1, MPI_INT, 1, 7, MPI_COMM_WORLD, &req));
  } else {
    MPI_CHECK(MPI_Irecv(&value, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, &req));
  }
  comm::wait_politely(&req, &status, us(1000));
  EXPECT_EQ(req, MPI_REQUEST_NULL);
  EXPECT_EQ(value, 42);
}

}  // namespace
}  // namespace ringtrain
