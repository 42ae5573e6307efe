// runtime/telemetry/gpu_monitor.cpp: one device's sample through NVML (runtime/cluster/nvml.h).
#include "runtime/telemetry/gpu_monitor.h"

#include <limits>

namespace ringtrain::runtime {

GpuMonitor::GpuMonitor(const std::string& pci_bus_id, int index, std::string library) {
  nvml_ = std::make_unique<Nvml>(Nvml::Use::Telemetry, std::move(library));
  if (!nvml_->ok()) {
    reason_ = nvml_->error();
    return;
  }
  void* device = nullptr;
  const int rc = pci_bus_id.empty() ? nvml_->by_index(static_cast<unsigned int>(index), &device)
                                    : nvml_->by_pci(pci_bus_id.c_str(), &device);
  if (rc != 0) {
    reason_ = "NVML has no device " +
              (pci_bus_id.empty() ? "index " + std::to_string(index) : "at PCI bus id " + pci_bus_id) + ": " +
              nvml_->error_string(rc);
    return;
  }
  device_ = device;
}

GpuMonitor::~GpuMonitor() = default;

std::optional<GpuSample> GpuMonitor::sample() {
  if (!device_) return std::nullopt;
  constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  NvmlUtilization util{};
  NvmlMemory memory{};
  unsigned int temperature = 0, milliwatts = 0;
  GpuSample out{kNone, kNone, kNone, kNone, kNone};
  // A query the device does not support leaves its field NaN; any other failure drops the sample.
  auto query = [&](const char* what, int rc) {
    if (rc == 0) return true;
    if (rc == kNvmlNotSupported) return false;  // e.g. power on some boards, utilisation on MIG
    reason_ = std::string(what) + " failed: " + nvml_->error_string(rc);
    throw rc;
  };
  try {
    if (query("nvmlDeviceGetUtilizationRates", nvml_->utilization(device_, &util))) out.util_pct = util.gpu;
    if (query("nvmlDeviceGetMemoryInfo", nvml_->memory(device_, &memory))) {
      out.mem_used_bytes = static_cast<double>(memory.used);
      out.mem_total_bytes = static_cast<double>(memory.total);
    }
    if (query("nvmlDeviceGetTemperature", nvml_->temperature(device_, kNvmlTemperatureGpu, &temperature)))
      out.temperature_c = temperature;
    if (query("nvmlDeviceGetPowerUsage", nvml_->power(device_, &milliwatts))) out.power_w = milliwatts / 1000.0;
  } catch (int) {
    return std::nullopt;
  }
  return out;
}

}  // namespace ringtrain::runtime
