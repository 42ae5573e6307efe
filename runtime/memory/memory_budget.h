// runtime/memory/memory_budget.h: how much memory a rank may use, the budget the memory plan checks a
// configuration's predicted peak against. On the CPU the free memory is the smaller of MemAvailable
// (/proc/meminfo) and what the cgroup's limit leaves (v2 memory.max - memory.current, or v1
// memory.limit_in_bytes - memory.usage_in_bytes); on CUDA it is cudaMemGetInfo's free bytes. The ranks of
// one host (or one GPU) share it: a rank's budget is what it holds now plus its share of the free memory.
//
//   const FreeMemory free = host_free_memory();           // "12.3 GiB free (MemAvailable)"
//   const int64_t budget = rank_budget(free.bytes, peak_rss_now, world.local_size());
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"

namespace ringtrain::runtime {

struct FreeMemory {
  int64_t bytes = 0;
  std::string source;       // what bounds it: "MemAvailable", "cgroup v2 memory.max 8.00 GiB", "cudaMemGetInfo"
  std::string str() const;  // "12.3 GiB free (MemAvailable)"
};

// The host's free memory for new allocations. `meminfo` and `cgroup_root` are the files' places (tests
// give fakes). Errors name the file: a /proc/meminfo without MemAvailable, a cgroup file that is not a
// number. A cgroup without a limit ("max", or v1's huge sentinel) does not bound it; no cgroup files at
// all is not an error.
FreeMemory host_free_memory(const std::string& meminfo = "/proc/meminfo",
                            const std::string& cgroup_root = "/sys/fs/cgroup");
// A CUDA device's free memory (cudaMemGetInfo); errors without CUDA name the device.
FreeMemory device_free_memory(Device device);

// A rank's budget: the bytes it holds now (`held_now`, e.g. its resident set) plus its equal share of
// `free_bytes` among the `sharing` ranks of its host or GPU. Errors: sharing < 1, negative bytes.
int64_t rank_budget(int64_t free_bytes, int64_t held_now, int sharing);

}  // namespace ringtrain::runtime
