// runtime/telemetry/gpu_monitor.h: GPU telemetry (utilisation, memory, temperature, power) through NVML, loaded at
// run time (runtime/cluster/nvml.h): no build dependency on the driver's library, and a machine without it
// simply has no samples. The library is libnvidia-ml.so.1 unless RINGTRAIN_NVML_LIBRARY (or the constructor)
// names another file. The device is found by PCI bus id, so CUDA_VISIBLE_DEVICES renumbering does not
// matter; without a bus id NVML's index is used.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "runtime/cluster/nvml.h"

namespace ringtrain::runtime {

// A field the device cannot report (NVML_ERROR_NOT_SUPPORTED) is NaN.
struct GpuSample {
  double util_pct = 0;  // percent of the last sample period a kernel was running
  double mem_used_bytes = 0, mem_total_bytes = 0;
  double temperature_c = 0;
  double power_w = 0;
};

class GpuMonitor {
 public:
  // Never throws: when NVML or the device is missing, available() is false and reason() says why.
  explicit GpuMonitor(const std::string& pci_bus_id, int index = 0, std::string library = "");
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  bool available() const { return device_ != nullptr; }
  const std::string& reason() const { return reason_; }
  // One reading; nullopt (and reason() naming the failed query) when a query fails for another reason
  // than "not supported".
  std::optional<GpuSample> sample();

 private:
  std::unique_ptr<Nvml> nvml_;
  void* device_ = nullptr;  // nvmlDevice_t
  std::string reason_;
};

}  // namespace ringtrain::runtime
