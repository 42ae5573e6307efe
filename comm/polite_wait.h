// comm/polite_wait.h (internal): waiting for an MPI request without taking a core from the ranks that
// compute. MPI_Wait and the blocking collectives busy-poll, and over TCP every poll is a system call:
// a rank waiting for a slower one (a pipeline's last stage at the step's check-in while the first still
// runs its last backward) takes the cores the busy ranks need wherever ranks share them.
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>

namespace ringtrain::comm {

// Polls briefly, then yields between polls (other runnable threads go first), then sleeps with a growing
// pause: doubling from 10 us to 100 us, then a quarter of the time slept so far, at most `max_pause`, so
// a request is noticed at most 25% later than it finished (and at most `max_pause`). MPI makes progress,
// a non-blocking collective's rounds included, inside MPI_Test. `before_sleep` (may throw) runs before
// every sleep: a cancelled owner ends the wait there. Failures are ringtrain::Errors naming the call.
void wait_politely(MPI_Request* request, MPI_Status* status, std::chrono::microseconds max_pause,
                   const std::function<void()>& before_sleep = {});

// The same wait on any condition: `done` is polled 64 times, then 256 times with a yield before each,
// then after every sleep (the pauses above) until it is true. A channel's message, which its own progress
// thread completes, is waited for so (comm/p2p.cpp).
void wait_politely_until(const std::function<bool()>& done, std::chrono::microseconds max_pause,
                         const std::function<void()>& before_sleep = {});

// The rule of those pauses: the one after `pause`, with `slept` slept so far in this wait.
std::chrono::microseconds next_polite_pause(std::chrono::microseconds pause, std::chrono::microseconds slept,
                                            std::chrono::microseconds max_pause);

}  // namespace ringtrain::comm
