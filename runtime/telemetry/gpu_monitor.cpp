// runtime/telemetry/gpu_monitor.cpp: the few NVML entry points ringtrain needs, resolved with dlsym. The types are
// NVML's ABI (nvml.h): functions return an int status (0 = success) and devices are opaque pointers.
#include "runtime/telemetry/gpu_monitor.h"

#include <dlfcn.h>

#include <cstdlib>
#include <limits>

namespace ringtrain {

namespace {
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
constexpr int kNvmlTemperatureGpu = 0;
}  // namespace

struct GpuMonitor::Api {
  int (*init)();
  int (*shutdown)();
  const char* (*error_string)(int);
  int (*by_index)(unsigned int, void**);
  int (*by_pci)(const char*, void**);
  int (*utilization)(void*, NvmlUtilization*);
  int (*memory)(void*, NvmlMemory*);
  int (*temperature)(void*, int, unsigned int*);
  int (*power)(void*, unsigned int*);  // milliwatts
};

namespace {
template <typename F>
bool resolve(void* handle, const char* name, F& out, std::string& missing) {
  out = reinterpret_cast<F>(dlsym(handle, name));
  if (!out && missing.empty()) missing = name;
  return out != nullptr;
}
}  // namespace

GpuMonitor::GpuMonitor(const std::string& pci_bus_id, int index, std::string library) {
  if (library.empty()) {
    const char* env = std::getenv("RINGTRAIN_NVML_LIBRARY");
    library = env && *env ? env : "libnvidia-ml.so.1";
  }
  handle_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* why = dlerror();
    reason_ = "NVML library '" + library + "' not loaded: " + (why ? why : "unknown error");
    return;
  }
  api_ = new Api{};
  std::string missing;
  resolve(handle_, "nvmlInit_v2", api_->init, missing);
  resolve(handle_, "nvmlShutdown", api_->shutdown, missing);
  resolve(handle_, "nvmlErrorString", api_->error_string, missing);
  resolve(handle_, "nvmlDeviceGetHandleByIndex_v2", api_->by_index, missing);
  resolve(handle_, "nvmlDeviceGetHandleByPciBusId_v2", api_->by_pci, missing);
  resolve(handle_, "nvmlDeviceGetUtilizationRates", api_->utilization, missing);
  resolve(handle_, "nvmlDeviceGetMemoryInfo", api_->memory, missing);
  resolve(handle_, "nvmlDeviceGetTemperature", api_->temperature, missing);
  resolve(handle_, "nvmlDeviceGetPowerUsage", api_->power, missing);
  if (!missing.empty()) {
    reason_ = "NVML library '" + library + "' lacks " + missing;
    return;
  }
  if (int rc = api_->init(); rc != 0) {
    reason_ = std::string("nvmlInit failed: ") + api_->error_string(rc);
    api_->shutdown = nullptr;  // nothing to shut down
    return;
  }
  void* device = nullptr;
  const int rc = pci_bus_id.empty() ? api_->by_index(static_cast<unsigned int>(index), &device)
                                    : api_->by_pci(pci_bus_id.c_str(), &device);
  if (rc != 0) {
    reason_ = "NVML has no device " +
              (pci_bus_id.empty() ? "index " + std::to_string(index) : "at PCI bus id " + pci_bus_id) + ": " +
              api_->error_string(rc);
    return;
  }
  device_ = device;
}

GpuMonitor::~GpuMonitor() {
  if (api_ && api_->shutdown) api_->shutdown();
  delete api_;
  if (handle_) dlclose(handle_);
}

std::optional<GpuSample> GpuMonitor::sample() {
  if (!device_) return std::nullopt;
  constexpr int kNotSupported = 3;  // NVML_ERROR_NOT_SUPPORTED: e.g. power on some boards, utilisation on MIG
  constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  NvmlUtilization util{};
  NvmlMemory memory{};
  unsigned int temperature = 0, milliwatts = 0;
  GpuSample out{kNone, kNone, kNone, kNone, kNone};
  // A query the device does not support leaves its field NaN; any other failure drops the sample.
  auto query = [&](const char* what, int rc) {
    if (rc == 0) return true;
    if (rc == kNotSupported) return false;
    reason_ = std::string(what) + " failed: " + api_->error_string(rc);
    throw rc;
  };
  try {
    if (query("nvmlDeviceGetUtilizationRates", api_->utilization(device_, &util))) out.util_pct = util.gpu;
    if (query("nvmlDeviceGetMemoryInfo", api_->memory(device_, &memory))) {
      out.mem_used_bytes = static_cast<double>(memory.used);
      out.mem_total_bytes = static_cast<double>(memory.total);
    }
    if (query("nvmlDeviceGetTemperature", api_->temperature(device_, kNvmlTemperatureGpu, &temperature)))
      out.temperature_c = temperature;
    if (query("nvmlDeviceGetPowerUsage", api_->power(device_, &milliwatts))) out.power_w = milliwatts / 1000.0;
  } catch (int) {
    return std::nullopt;
  }
  return out;
}

}  // namespace ringtrain
