// runtime/telemetry/gpu_telemetry.h: the run log's "gpu" records. With a CUDA device and a run log, each rank reads
// its GPU through NVML (runtime/telemetry/gpu_monitor.h) at every logged interval and rank 0 gathers the readings into
// one record; without NVML, or off the GPU, nothing is read and (on a GPU) rank 0 says why once.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "comm/world.h"
#include "core/device.h"
#include "runtime/telemetry/gpu_monitor.h"

namespace ringtrain::runtime {

class GpuTelemetry {
 public:
  // Collective in spirit (every rank makes the same decision from the same flags).
  GpuTelemetry(const comm::World& world, Device device, bool enabled);
  bool on() const { return on_; }
  // Collective when on(): every rank's reading; rank 0 gets the record (nullopt elsewhere, when off, or
  // when no rank could read its GPU).
  std::optional<nlohmann::json> sample(int64_t step);

 private:
  const comm::World& world_;
  bool on_ = false;
  std::unique_ptr<GpuMonitor> monitor_;
};

}  // namespace ringtrain::runtime
