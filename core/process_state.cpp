// core/process_state.cpp: the process-wide state ops read (core/ops.h): the default generator's seed and its next
// stream, and whether f32 matrix products may use TF32. One per process, shared by every thread.
#include <atomic>

#include "core/ops.h"

namespace ringtrain {

namespace {
std::atomic<bool> g_allow_tf32{true};
std::atomic<uint64_t> g_seed{0x5eed};
std::atomic<uint64_t> g_stream{1};
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }
void manual_seed(uint64_t seed) {
  g_seed = seed;
  g_stream = 1;
}
uint64_t default_seed() { return g_seed; }
uint64_t next_rng_stream() { return g_stream.fetch_add(1); }
uint64_t rng_stream() { return g_stream.load(); }
void set_rng_stream(uint64_t stream) { g_stream = stream; }

}  // namespace ringtrain
