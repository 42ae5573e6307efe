/* tests/runtime/fake_nvml.c: a stand-in for libnvidia-ml.so.1 with one device at PCI bus id 0000:65:00.0
   (index 0) reporting fixed readings, so GpuMonitor is tested on machines without a GPU. */
#include <stdlib.h>
#include <string.h>

typedef struct {
  unsigned int gpu, memory;
} Utilization;
typedef struct {
  unsigned long long total, free, used;
} Memory;
static int device_token;
static int initialised;

int nvmlInit_v2(void) {
  initialised = 1;
  return 0;
}
int nvmlShutdown(void) {
  initialised = 0;
  return 0;
}
const char* nvmlErrorString(int rc) { return rc == 6 ? "Not Found" : rc == 1 ? "Uninitialized" : "Unknown Error"; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (!initialised) return 1;
  if (index != 0) return 6;
  *device = &device_token;
  return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** device) {
  if (!initialised) return 1;
  if (strcmp(bus_id, "0000:65:00.0") != 0) return 6;
  *device = &device_token;
  return 0;
}
int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  if (device != &device_token) return 999;
  u->gpu = 87;
  u->memory = 40;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  if (device != &device_token) return 999;
  m->total = 150ull << 30;
  m->used = 12ull << 30;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetTemperature(void* device, int sensor, unsigned int* t) {
  if (device != &device_token || sensor != 0) return 999;
  *t = 61;
  return 0;
}
int nvmlDeviceGetPowerUsage(void* device, unsigned int* milliwatts) {
  if (device != &device_token) return 999;
  if (getenv("FAKE_NVML_NO_POWER")) return 3; /* NVML_ERROR_NOT_SUPPORTED */
  *milliwatts = 412500;
  return 0;
}
