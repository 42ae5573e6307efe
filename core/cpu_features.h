// core/cpu_features.h: the instructions this CPU offers the kernels, read once with cpuid, each only
// where the operating system also saves its registers (XCR0: the AVX, AVX-512 and AMX tile state). The
// names are /proc/cpuinfo's. What the 16-bit CPU kernels make of them is cpu_half_path():
//
//   cpu_features().avx512_bf16              // this CPU multiplies bf16 pairs into f32 (vdpbf16ps)
//   cpu_half_path(DType::BF16).path          // "f32": how bf16 convolutions and GEMMs run here
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"

namespace ringtrain {

struct CpuFeatures {
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512_bf16 = false, avx512_fp16 = false;  // Cooper Lake / Zen 4 on; Sapphire Rapids
  bool amx_tile = false, amx_bf16 = false;                         // Sapphire Rapids on
  std::vector<std::string> names() const;  // those present, /proc/cpuinfo's spelling, in the order above
};
const CpuFeatures& cpu_features();

// How the CPU's convolutions and GEMMs run a 16-bit type (BF16 or F16) on this machine, and why; the plan
// record and ringtrain_env print it. Today every CPU takes "f32": the operands convert to f32 around the
// f32 kernels (correct, not faster than fp32). The why names the instructions this CPU has for the type,
// or that it has none, so a user sees whether a faster path could exist here.
struct HalfPath {
  std::string path, why;
};
HalfPath cpu_half_path(DType dtype);

}  // namespace ringtrain
