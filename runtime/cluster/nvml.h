// runtime/cluster/nvml.h: NVML, the driver's management library, loaded at run time (dlopen and dlsym): no
// build dependency on the driver, and a machine without it is a reason to print, not a failure to link.
// One loader for the GPU choice (runtime/cluster/gpu_choice.h: inventory, processes, ECC, throttling) and the
// telemetry (runtime/telemetry/gpu_monitor.h: utilisation, memory, temperature, power). The library is
// libnvidia-ml.so.1 unless RINGTRAIN_NVML_LIBRARY (or the caller) names another file. The types are NVML's
// ABI (nvml.h): functions return an int status (0 = success) and devices are opaque pointers.
#pragma once

#include <string>

namespace ringtrain::runtime {

struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlPciInfo {  // nvmlPciInfo_t (v3)
  char bus_id_legacy[16];
  unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
struct NvmlProcessInfo {  // nvmlProcessInfo_v2_t / _v3_t
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
};
constexpr int kNvmlNotSupported = 3;      // NVML_ERROR_NOT_SUPPORTED
constexpr int kNvmlInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE
constexpr int kNvmlTemperatureGpu = 0;    // NVML_TEMPERATURE_GPU

// The entry points, resolved and initialised (nvmlInit) when made; shut down and closed when it goes.
// Never throws: error() says why it is unusable (the library not found, a required entry point missing, the
// init failed). What is required is the caller's use; the other entry points may be null.
class Nvml {
 public:
  enum class Use : unsigned char {
    Inventory,  // GPU choice: count, uuid, name, PCI info, memory, utilisation, running processes
    Telemetry,  // monitoring one device: by index or PCI bus id, utilisation, memory, temperature, power
  };
  explicit Nvml(Use use, std::string library = "");
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  // "what: NVML's text for rc"
  std::string why(const char* what, int rc) const;

  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*count)(unsigned int*) = nullptr;
  int (*by_index)(unsigned int, void**) = nullptr;
  int (*by_pci)(const char*, void**) = nullptr;
  int (*uuid)(void*, char*, unsigned int) = nullptr;
  int (*name)(void*, char*, unsigned int) = nullptr;
  int (*pci)(void*, NvmlPciInfo*) = nullptr;
  int (*memory)(void*, NvmlMemory*) = nullptr;
  int (*utilization)(void*, NvmlUtilization*) = nullptr;
  int (*processes)(void*, unsigned int*, NvmlProcessInfo*) = nullptr;
  int (*temperature)(void*, int, unsigned int*) = nullptr;
  int (*power)(void*, unsigned int*) = nullptr;                // milliwatts
  int (*ecc)(void*, int, int, unsigned long long*) = nullptr;  // optional for every use
  int (*throttle)(void*, unsigned long long*) = nullptr;       // optional for every use

 private:
  void* handle_ = nullptr;
  bool initialised_ = false;
  std::string error_;
};

}  // namespace ringtrain::runtime
