// tests/core/test_cpu_features.cpp: cpuid read as the kernel reads it, and what the 16-bit path says.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>

#include "core/cpu_features.h"
#include "test_util.h"

namespace ringtrain {
namespace {

// The first "flags" line of /proc/cpuinfo (empty where there is none).
std::set<std::string> kernel_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    }
  return {};
}

TEST(CpuFeatures, AgreeWithTheKernelsFlags) {
  const std::set<std::string> flags = kernel_flags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo to compare with";
  const std::vector<std::string> names = cpu_features().names();
  for (const char* name : {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"}) {
    const bool ours = std::find(names.begin(), names.end(), name) != names.end();
    EXPECT_EQ(ours, flags.count(name) == 1) << name;
  }
}

TEST(CpuFeatures, TheHalfPathNamesWhatThisCpuHas) {
  const CpuFeatures& f = cpu_features();
  set_cpu_bf16_path("auto");
  const HalfPath bf16 = cpu_half_path(DType::BF16), fp16 = cpu_half_path(DType::F16);
  EXPECT_EQ(bf16.path, f.avx512_bf16 ? (f.amx_bf16 ? "amx" : "avx512_bf16") : "f32");
  EXPECT_EQ(fp16.path, "f32");
  if (f.avx512_bf16)
    EXPECT_NE(bf16.why.find(f.amx_bf16 ? "run oneDNN's AMX kernels" : "run oneDNN's avx512_core_bf16 kernels"),
              std::string::npos)
        << bf16.why;
  else
    EXPECT_NE(bf16.why.find("this CPU has no avx512_bf16 or amx_bf16"), std::string::npos) << bf16.why;
  EXPECT_NE(fp16.why.find(f.avx512_fp16 ? "this CPU has avx512_fp16" : "this CPU has no avx512_fp16"),
            std::string::npos)
      << fp16.why;
  if (f.avx512_bf16) {
    set_cpu_bf16_path("f32");
    const HalfPath forced = cpu_half_path(DType::BF16);
    EXPECT_EQ(forced.path, "f32");
    EXPECT_NE(forced.why.find("but the f32 path was chosen"), std::string::npos) << forced.why;
    set_cpu_bf16_path("auto");
  }
  const std::string e = testing::error_of([] { cpu_half_path(DType::F32); });
  EXPECT_NE(e.find("cpu_half_path: f32 is no 16-bit float type"), std::string::npos) << e;
}

}  // namespace
}  // namespace ringtrain
