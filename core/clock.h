// core/clock.h: the steady clock every timing in ringtrain reads, and its durations in seconds.
#pragma once

#include <chrono>

namespace ringtrain {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace ringtrain
