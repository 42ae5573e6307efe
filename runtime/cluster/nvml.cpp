// runtime/cluster/nvml.cpp: the loader: every entry point resolved, the use's required ones checked.
#include "runtime/cluster/nvml.h"
#include "core/env.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>

namespace ringtrain::runtime {

Nvml::Nvml(Use use, std::string library) {
  if (library.empty()) {
    library = env_text("RINGTRAIN_NVML_LIBRARY").value_or("libnvidia-ml.so.1");
  }
  handle_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* why = dlerror();
    error_ = "NVML library '" + library + "' not loaded: " + (why ? why : "unknown error");
    return;
  }
  std::string missing;
  // The first of the names the library has (newer ones first); a required one missing is named.
  auto resolve = [&](auto& out, bool required, const char* first, const char* second = nullptr) {
    out = reinterpret_cast<std::remove_reference_t<decltype(out)>>(dlsym(handle_, first));
    if (!out && second) out = reinterpret_cast<std::remove_reference_t<decltype(out)>>(dlsym(handle_, second));
    if (!out && required && missing.empty()) missing = first;
  };
  const bool inventory = use == Use::Inventory, telemetry = use == Use::Telemetry;
  resolve(init, true, "nvmlInit_v2");
  resolve(shutdown, true, "nvmlShutdown");
  resolve(error_string, true, "nvmlErrorString");
  resolve(count, inventory, "nvmlDeviceGetCount_v2");
  resolve(by_index, true, "nvmlDeviceGetHandleByIndex_v2");
  resolve(by_pci, telemetry, "nvmlDeviceGetHandleByPciBusId_v2");
  resolve(uuid, inventory, "nvmlDeviceGetUUID");
  resolve(name, inventory, "nvmlDeviceGetName");
  resolve(pci, inventory, "nvmlDeviceGetPciInfo_v3");
  resolve(memory, true, "nvmlDeviceGetMemoryInfo");
  resolve(utilization, true, "nvmlDeviceGetUtilizationRates");
  resolve(processes, inventory, "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2");
  resolve(temperature, telemetry, "nvmlDeviceGetTemperature");
  resolve(power, telemetry, "nvmlDeviceGetPowerUsage");
  resolve(ecc, false, "nvmlDeviceGetTotalEccErrors");
  resolve(throttle, false, "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetCurrentClocksEventReasons");
  if (!missing.empty()) {
    error_ = "NVML library '" + library + "' lacks " + missing;
    return;
  }
  if (const int rc = init(); rc != 0) {
    error_ = std::string("nvmlInit failed: ") + error_string(rc);
    return;
  }
  initialised_ = true;
}

Nvml::~Nvml() {
  if (initialised_ && shutdown) shutdown();
  if (handle_) dlclose(handle_);
}

std::string Nvml::why(const char* what, int rc) const {
  return std::string(what) + ": " + (error_string ? error_string(rc) : "NVML error " + std::to_string(rc));
}

}  // namespace ringtrain::runtime
