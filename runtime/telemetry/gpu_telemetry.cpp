// runtime/telemetry/gpu_telemetry.cpp: NVML readings gathered on rank 0.
#include "runtime/telemetry/gpu_telemetry.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "comm/host_collectives.h"

namespace ringtrain::runtime {

GpuTelemetry::GpuTelemetry(const comm::World& world, Device device, bool enabled)
    : world_(world), on_(enabled && device.is_cuda()) {
  if (!on_) return;
  const auto& infos = cuda_status().devices;
  const auto at = static_cast<size_t>(device.index);
  monitor_ = std::make_unique<GpuMonitor>(at < infos.size() ? infos[at].pci_bus_id : "", device.index);
  if (world.is_root() && !monitor_->available()) std::printf("GPU telemetry off: %s\n", monitor_->reason().c_str());
}

std::optional<nlohmann::json> GpuTelemetry::sample(int64_t step) {
  if (!on_) return std::nullopt;
  double mine[6] = {0, 0, 0, 0, 0, 0};  // valid, utilisation, memory used, memory total, temperature, power
  if (auto g = monitor_->sample()) {
    const double values[6] = {1, g->util_pct, g->mem_used_bytes, g->mem_total_bytes, g->temperature_c, g->power_w};
    std::copy(std::begin(values), std::end(values), mine);
  }
  const std::vector<double> all = comm::gather(world_.comm(), std::span<const double>(mine, 6));
  if (!world_.is_root()) return std::nullopt;
  nlohmann::json samples = nlohmann::json::array();
  for (int r = 0; r < world_.size(); ++r) {
    const double* v = all.data() + 6 * static_cast<size_t>(r);
    if (v[0] <= 0) continue;
    nlohmann::json one{{"rank", r}};
    const char* names[5] = {"util_pct", "mem_used_bytes", "mem_total_bytes", "temperature_c", "power_w"};
    for (int f = 0; f < 5; ++f)
      if (std::isfinite(v[f + 1])) one[names[f]] = v[f + 1];  // a field the board cannot report is left out
    samples.push_back(one);
  }
  if (samples.empty()) return std::nullopt;
  return nlohmann::json{{"type", "gpu"}, {"step", step}, {"samples", samples}};
}

}  // namespace ringtrain::runtime
