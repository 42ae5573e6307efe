// runtime/memory/memory_budget.cpp: free memory from /proc/meminfo, the cgroup (v2, then v1) and cudaMemGetInfo.
#include "runtime/memory/memory_budget.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/allocator.h"
#include "core/check.h"
#include "core/parse.h"

namespace ringtrain::runtime {
namespace {

namespace fs = std::filesystem;

// The first line of `path` as a byte count: nullopt when the file does not exist or says "max" (no limit).
std::optional<int64_t> cgroup_value(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text;
  std::getline(in, text);
  if (text == "max") return std::nullopt;
  const std::optional<int64_t> v = to_number<int64_t>(text);
  RT_CHECK(v && *v >= 0, "cgroup file '", path.string(), "': expected a byte count or 'max', got '", text, "'");
  return *v;
}

// v1 writes a page-rounded LONG_MAX for "no limit".
constexpr int64_t kNoLimitV1 = int64_t{1} << 60;

}  // namespace

std::string FreeMemory::str() const { return detail::str_cat(format_bytes(bytes), " free (", source, ")"); }

FreeMemory host_free_memory(const std::string& meminfo, const std::string& cgroup_root) {
  std::ifstream in(meminfo);
  RT_CHECK(in.good(), "cannot read '", meminfo, "' for the free memory");
  std::optional<int64_t> available;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    long long kb = -1;
    std::string unit;
    fields >> kb >> unit;
    RT_CHECK(fields && kb >= 0 && unit == "kB", "'", meminfo, "': MemAvailable line '", line, "' is not '<number> kB'");
    available = static_cast<int64_t>(kb) * 1024;
  }
  RT_CHECK(available.has_value(), "'", meminfo, "' has no MemAvailable line (a kernel older than 3.14?)");
  FreeMemory free{*available, "MemAvailable"};
  const fs::path root(cgroup_root);
  struct Pair {
    const char* limit;
    const char* usage;
    const char* name;
  };
  for (const Pair& p :
       {Pair{"memory.max", "memory.current", "cgroup v2 memory.max"},
        Pair{"memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "cgroup v1 memory.limit_in_bytes"}}) {
    const std::optional<int64_t> limit = cgroup_value(root / p.limit);
    if (!limit || *limit >= kNoLimitV1) continue;
    const int64_t usage = cgroup_value(root / p.usage).value_or(0);
    const int64_t left = std::max<int64_t>(0, *limit - usage);
    if (left < free.bytes)
      free = {left, detail::str_cat(p.name, " ", format_bytes(*limit), " less ", format_bytes(usage), " in use")};
    break;  // one hierarchy per machine
  }
  return free;
}

FreeMemory device_free_memory(Device device) {
  if (device.is_cpu()) return host_free_memory();
  return {cuda_free_memory_bytes(device), "cudaMemGetInfo"};
}

int64_t rank_budget(int64_t free_bytes, int64_t held_now, int sharing) {
  RT_CHECK(sharing >= 1, "rank_budget: ranks sharing the memory must be at least 1, got ", sharing);
  RT_CHECK(free_bytes >= 0 && held_now >= 0, "rank_budget: negative bytes (free ", free_bytes, ", held ", held_now,
           ")");
  return held_now + free_bytes / sharing;
}

}  // namespace ringtrain::runtime
