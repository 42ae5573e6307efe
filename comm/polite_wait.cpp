// comm/polite_wait.cpp: see polite_wait.h.
#include "comm/polite_wait.h"

#include <algorithm>
#include <thread>

#include "comm/mpi_check.h"

namespace ringtrain::comm {

void wait_politely_until(const std::function<bool()>& done, std::chrono::microseconds max_pause,
                         const std::function<void()>& before_sleep) {
  for (int i = 0; i < 64; ++i)
    if (done()) return;
  for (int i = 0; i < 256; ++i) {
    std::this_thread::yield();
    if (done()) return;
  }
  using us = std::chrono::microseconds;
  us pause(10), slept(0);
  for (;;) {
    if (before_sleep) before_sleep();
    std::this_thread::sleep_for(pause);
    slept += pause;
    if (done()) return;
    pause = next_polite_pause(pause, slept, max_pause);
  }
}

void wait_politely(MPI_Request* request, MPI_Status* status, std::chrono::microseconds max_pause,
                   const std::function<void()>& before_sleep) {
  wait_politely_until(
      [&] {
        int done = 0;
        MPI_CHECK(MPI_Test(request, &done, status));
        return done != 0;
      },
      max_pause, before_sleep);
}

std::chrono::microseconds next_polite_pause(std::chrono::microseconds pause, std::chrono::microseconds slept,
                                            std::chrono::microseconds max_pause) {
  using us = std::chrono::microseconds;
  return std::min(std::max(std::min(pause * 2, us(100)), slept / 4), max_pause);
}

}  // namespace ringtrain::comm
