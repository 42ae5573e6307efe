// runtime/telemetry/progress.h: rank 0's progress output. A redrawn bar on a terminal, plain lines otherwise:
//   epoch 1/90 [#####...] 120/390 loss 1.2345 lr 0.1 1234 img/s ETA 0:12:34
//   epoch 1/90 step 120/35100 loss 1.2345 lr 0.1 1234 img/s ETA 5:43:21
// Under mpirun rank 0's stdout is a pseudo-terminal even when mpirun's own output goes to a file, so
// "auto" means lines there. Every rank must agree (the bar reports every step, with a collective), so
// rank 0 decides and tells the others.
#pragma once

#include <cstdint>
#include <string>

#include "comm/world.h"
#include "runtime/config/options.h"

namespace ringtrain::runtime {

// Collective: true when the bar is used (rank 0's decision).
bool use_progress_bar(const comm::World& world, ProgressStyle style);

struct ProgressLine {
  int64_t epoch = 0, epochs = 1;                   // 0-based epoch
  int64_t step = 0, total_steps = 0;               // steps done
  int64_t step_in_epoch = 0, steps_per_epoch = 1;  // 1-based position in the epoch
  double loss = 0, lr = 0, img_per_s = 0, eta_s = 0;
};
// Prints (and flushes) one update: a redraw of the bar, or one line.
void print_progress(bool bar, const ProgressLine& p);

// "H:MM:SS"
std::string format_duration(double seconds);

}  // namespace ringtrain::runtime
