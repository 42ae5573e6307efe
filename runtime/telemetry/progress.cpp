// runtime/telemetry/progress.cpp: the bar, the lines, and the decision between them.
#include "runtime/telemetry/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "comm/host_collectives.h"
#include "core/check.h"

namespace ringtrain::runtime {

bool use_progress_bar(const comm::World& world, ProgressStyle style) {
  const bool mine = style == ProgressStyle::Bar ||
                    (style == ProgressStyle::Auto && isatty(STDOUT_FILENO) && !std::getenv("OMPI_COMM_WORLD_SIZE"));
  return comm::broadcast(world.comm(), int64_t{mine ? 1 : 0}, 0) != 0;
}

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

void print_progress(bool bar, const ProgressLine& p) {
  if (bar) {
    const int width = 24;
    const int filled = static_cast<int>(width * p.step_in_epoch / std::max<int64_t>(1, p.steps_per_epoch));
    std::printf("\repoch %lld/%lld [%s%s] %lld/%lld loss %.4f lr %.4g %.0f img/s ETA %s   ",
                static_cast<long long>(p.epoch + 1), static_cast<long long>(p.epochs), std::string(filled, '#').c_str(),
                std::string(width - filled, '.').c_str(), static_cast<long long>(p.step_in_epoch),
                static_cast<long long>(p.steps_per_epoch), p.loss, p.lr, p.img_per_s, format_duration(p.eta_s).c_str());
  } else {
    std::printf("epoch %lld/%lld step %lld/%lld loss %.4f lr %.4g %.0f img/s ETA %s\n",
                static_cast<long long>(p.epoch + 1), static_cast<long long>(p.epochs), static_cast<long long>(p.step),
                static_cast<long long>(p.total_steps), p.loss, p.lr, p.img_per_s, format_duration(p.eta_s).c_str());
  }
  std::fflush(stdout);
}

}  // namespace ringtrain::runtime
