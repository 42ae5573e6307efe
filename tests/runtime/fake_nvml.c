/* tests/runtime/fake_nvml.c: a stand-in for libnvidia-ml.so.1, so GpuMonitor and the GPU inventory and
   choice are tested on machines without a GPU.

   Without FAKE_NVML_FILE: one device at PCI bus id 0000:65:00.0 (index 0) with fixed readings.
   With FAKE_NVML_FILE=PATH, read at every nvmlInit (a test rewrites it to change the machine):
     gpu UUID PCI NAME USED_MIB TOTAL_MIB UTIL_PCT ECC_UNCORRECTED THROTTLE_HEX   (a device, in index order)
     proc PID USED_MIB                                                           (a process on the last gpu)
     lost                                                                        (the last gpu fell off the bus)
   A lost device answers every query with NVML_ERROR_GPU_IS_LOST (15). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  unsigned int gpu, memory;
} Utilization;
typedef struct {
  unsigned long long total, free, used;
} Memory;
typedef struct {
  char bus_id_legacy[16];
  unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
} PciInfo;
typedef struct {
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
} ProcessInfo;

enum { kMaxGpus = 16, kMaxProcs = 16 };
typedef struct {
  char uuid[96], pci[32], name[64];
  unsigned long long used_mib, total_mib, ecc, throttle;
  unsigned int util;
  int lost;
  int procs;
  ProcessInfo proc[kMaxProcs];
} Gpu;
static Gpu gpus[kMaxGpus];
static int gpu_count;
static int initialised;

static void load(void) {
  const char* path = getenv("FAKE_NVML_FILE");
  gpu_count = 0;
  if (!path) {
    Gpu* g = &gpus[gpu_count++];
    memset(g, 0, sizeof *g);
    strcpy(g->uuid, "GPU-fake-0");
    strcpy(g->pci, "0000:65:00.0");
    strcpy(g->name, "Fake");
    g->total_mib = 150ull << 10;
    g->used_mib = 12ull << 10;
    g->util = 87;
    return;
  }
  FILE* f = fopen(path, "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    Gpu* last = gpu_count > 0 ? &gpus[gpu_count - 1] : NULL;
    if (strncmp(line, "gpu ", 4) == 0 && gpu_count < kMaxGpus) {
      Gpu* g = &gpus[gpu_count];
      memset(g, 0, sizeof *g);
      if (sscanf(line + 4, "%95s %31s %63s %llu %llu %u %llu %llx", g->uuid, g->pci, g->name, &g->used_mib,
                 &g->total_mib, &g->util, &g->ecc, &g->throttle) == 8)
        ++gpu_count;
    } else if (strncmp(line, "proc ", 5) == 0 && last && last->procs < kMaxProcs) {
      ProcessInfo* p = &last->proc[last->procs];
      unsigned long long mib = 0;
      if (sscanf(line + 5, "%u %llu", &p->pid, &mib) == 2) {
        p->used = mib << 20;
        ++last->procs;
      }
    } else if (strncmp(line, "lost", 4) == 0 && last) {
      last->lost = 1;
    }
  }
  fclose(f);
}

int nvmlInit_v2(void) {
  load();
  initialised = 1;
  return 0;
}
int nvmlShutdown(void) {
  initialised = 0;
  return 0;
}
const char* nvmlErrorString(int rc) {
  switch (rc) {
    case 6:
      return "Not Found";
    case 1:
      return "Uninitialized";
    case 7:
      return "Insufficient Size";
    case 15:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}
int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!initialised) return 1;
  *count = (unsigned int)gpu_count;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (!initialised) return 1;
  if (index >= (unsigned int)gpu_count) return 6;
  if (gpus[index].lost) return 15;
  *device = &gpus[index];
  return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** device) {
  if (!initialised) return 1;
  for (int i = 0; i < gpu_count; ++i)
    if (strcmp(bus_id, gpus[i].pci) == 0) {
      if (gpus[i].lost) return 15;
      *device = &gpus[i];
      return 0;
    }
  return 6;
}
static Gpu* gpu_of(void* device) {
  for (int i = 0; i < gpu_count; ++i)
    if (device == &gpus[i]) return &gpus[i];
  return NULL;
}
#define DEVICE_OR_FAIL(device) \
  Gpu* g = gpu_of(device);     \
  if (!g) return 999;          \
  if (g->lost) return 15;

int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  DEVICE_OR_FAIL(device)
  u->gpu = g->util;
  u->memory = g->util / 2;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  DEVICE_OR_FAIL(device)
  m->total = g->total_mib << 20;
  m->used = g->used_mib << 20;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetTemperature(void* device, int sensor, unsigned int* t) {
  DEVICE_OR_FAIL(device)
  if (sensor != 0) return 999;
  *t = 61;
  return 0;
}
int nvmlDeviceGetPowerUsage(void* device, unsigned int* milliwatts) {
  DEVICE_OR_FAIL(device)
  if (getenv("FAKE_NVML_NO_POWER")) return 3; /* NVML_ERROR_NOT_SUPPORTED */
  *milliwatts = 412500;
  return 0;
}
int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  DEVICE_OR_FAIL(device)
  if (strlen(g->uuid) + 1 > length) return 7;
  strcpy(uuid, g->uuid);
  return 0;
}
int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  DEVICE_OR_FAIL(device)
  if (strlen(g->name) + 1 > length) return 7;
  strcpy(name, g->name);
  return 0;
}
int nvmlDeviceGetPciInfo_v3(void* device, PciInfo* pci) {
  DEVICE_OR_FAIL(device)
  memset(pci, 0, sizeof *pci);
  strncpy(pci->bus_id, g->pci, sizeof pci->bus_id - 1);
  return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned int* count, ProcessInfo* infos) {
  DEVICE_OR_FAIL(device)
  if (*count < (unsigned int)g->procs) {
    *count = (unsigned int)g->procs;
    return 7;
  }
  *count = (unsigned int)g->procs;
  for (int i = 0; i < g->procs; ++i) infos[i] = g->proc[i];
  return 0;
}
int nvmlDeviceGetTotalEccErrors(void* device, int error_type, int counter_type, unsigned long long* count) {
  DEVICE_OR_FAIL(device)
  if (error_type != 1 || counter_type != 0) return 999; /* uncorrected, volatile */
  *count = g->ecc;
  return 0;
}
int nvmlDeviceGetCurrentClocksThrottleReasons(void* device, unsigned long long* reasons) {
  DEVICE_OR_FAIL(device)
  *reasons = g->throttle;
  return 0;
}
