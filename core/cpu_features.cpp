// core/cpu_features.cpp: cpuid and xgetbv on x86-64; nothing found elsewhere.
#include "core/cpu_features.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "core/check.h"
#include "core/env.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ringtrain {
namespace {

CpuFeatures read_features() {
  CpuFeatures f;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(1, 0, a, b, c, d);
  const bool osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u, fma = (c >> 12) & 1u;
  if (!osxsave || !avx) return f;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0u));
  const uint64_t xcr0 = (static_cast<uint64_t>(xcr0_hi) << 32) | xcr0_lo;
  const bool ymm = (xcr0 & 0x6u) == 0x6u;                    // SSE and AVX state
  const bool zmm = ymm && (xcr0 & 0xe0u) == 0xe0u;           // opmask, ZMM0-15 upper halves, ZMM16-31
  const bool tiles = (xcr0 & (3ull << 17)) == (3ull << 17);  // TILECFG and TILEDATA
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned leaf7_ebx = b, leaf7_edx = d, max_subleaf = a;
  f.avx2 = ymm && ((leaf7_ebx >> 5) & 1u);
  f.fma = ymm && fma;
  f.avx512f = zmm && ((leaf7_ebx >> 16) & 1u);
  f.avx512_fp16 = f.avx512f && ((leaf7_edx >> 23) & 1u);
  f.amx_tile = tiles && ((leaf7_edx >> 24) & 1u);
  f.amx_bf16 = f.amx_tile && ((leaf7_edx >> 22) & 1u);
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = f.avx512f && ((a >> 5) & 1u);
  }
#endif
  return f;
}

}  // namespace

std::vector<std::string> CpuFeatures::names() const {
  std::vector<std::string> out;
  const std::pair<bool, const char*> all[] = {{avx2, "avx2"},
                                              {fma, "fma"},
                                              {avx512f, "avx512f"},
                                              {avx512_bf16, "avx512_bf16"},
                                              {avx512_fp16, "avx512_fp16"},
                                              {amx_tile, "amx_tile"},
                                              {amx_bf16, "amx_bf16"}};
  for (const auto& [has, name] : all)
    if (has) out.emplace_back(name);
  return out;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = read_features();
  return features;
}

namespace {

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += out.empty() ? n : ", " + n;
  return out.empty() ? "none of avx2, avx512f, avx512_bf16, amx_bf16" : out;
}

// The fastest bf16 path this CPU has.
Bf16Kernels best_bf16() {
  const CpuFeatures& f = cpu_features();
  if (f.amx_bf16 && f.avx512_bf16) return Bf16Kernels::Amx;
  if (f.avx512_bf16) return Bf16Kernels::Avx512Bf16;
  return Bf16Kernels::F32;
}

Bf16Kernels parse_bf16_path(std::string_view name, const char* source) {
  const CpuFeatures& f = cpu_features();
  if (name.empty() || name == "auto") return best_bf16();
  if (name == "f32") return Bf16Kernels::F32;
  if (name == "avx512_bf16") {
    RT_CHECK(f.avx512_bf16, source,
             "avx512_bf16: this CPU has no avx512_bf16 instructions (it has: ", listed(f.names()), ")");
    return Bf16Kernels::Avx512Bf16;
  }
  if (name == "amx") {
    RT_CHECK(f.amx_bf16 && f.avx512_bf16, source,
             "amx: this CPU has no amx_bf16 instructions (it has: ", listed(f.names()), ")");
    return Bf16Kernels::Amx;
  }
  RT_THROW(source, "'", name, "' is not a CPU bf16 path: use auto, f32, avx512_bf16 or amx");
}

std::atomic<int>& bf16_choice() {
  static std::atomic<int> choice = [] {
    return static_cast<int>(parse_bf16_path(env_text("RINGTRAIN_CPU_BF16").value_or(""), "RINGTRAIN_CPU_BF16="));
  }();
  return choice;
}

}  // namespace

Bf16Kernels cpu_bf16_kernels() { return static_cast<Bf16Kernels>(bf16_choice().load()); }

void set_cpu_bf16_path(std::string_view name) {
  bf16_choice().store(static_cast<int>(parse_bf16_path(name, "CPU bf16 path ")));
}

const char* bf16_path_name(Bf16Kernels k) {
  switch (k) {
    case Bf16Kernels::Avx512Bf16:
      return "avx512_bf16";
    case Bf16Kernels::Amx:
      return "amx";
    case Bf16Kernels::F32:
      break;
  }
  return "f32";
}

HalfPath cpu_half_path(DType dtype) {
  RT_CHECK(dtype == DType::BF16 || dtype == DType::F16, "cpu_half_path: ", dtype_name(dtype),
           " is no 16-bit float type (BF16 or F16)");
  const CpuFeatures& f = cpu_features();
  std::string has;
  auto add = [&](bool present, const char* name) {
    if (present) has += has.empty() ? name : detail::str_cat(", ", name);
  };
  if (dtype == DType::F16) {
    if (!f.avx512_fp16)
      return {"f32",
              "this CPU has no avx512_fp16: fp16 operands convert to f32 around the f32 kernels, no faster "
              "than fp32"};
    return {"f32",
            "this CPU has avx512_fp16, but ringtrain has no fp16 CPU kernels for it: fp16 operands convert to "
            "f32 around the f32 kernels, no faster than fp32 (--precision bf16 has fast kernels here)"};
  }
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_bf16, "amx_bf16");
  switch (cpu_bf16_kernels()) {
    case Bf16Kernels::Amx:
      return {"amx", "this CPU has " + has +
                         ": bf16 convolutions and GEMMs run oneDNN's AMX kernels (avx512_core_bf16 where it has no "
                         "AMX one), f32 accumulation"};
    case Bf16Kernels::Avx512Bf16:
      return {"avx512_bf16", "this CPU has " + has +
                                 ": bf16 convolutions and GEMMs run oneDNN's avx512_core_bf16 kernels, f32 "
                                 "accumulation"};
    case Bf16Kernels::F32:
      break;
  }
  if (has.empty())
    return {"f32",
            "this CPU has no avx512_bf16 or amx_bf16: bf16 operands convert to f32 around the f32 kernels, "
            "no faster than fp32"};
  return {"f32", "this CPU has " + has +
                     ", but the f32 path was chosen (RINGTRAIN_CPU_BF16=f32): bf16 operands convert to f32 around "
                     "the f32 kernels, no faster than fp32"};
}

}  // namespace ringtrain
