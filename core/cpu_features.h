// core/cpu_features.h: the instructions this CPU offers the kernels, read once with cpuid, each only
// where the operating system also saves its registers (XCR0: the AVX, AVX-512 and AMX tile state). The
// names are /proc/cpuinfo's. What the 16-bit CPU kernels make of them is cpu_half_path():
//
//   cpu_features().avx512_bf16              // this CPU multiplies bf16 pairs into f32 (vdpbf16ps)
//   cpu_half_path(DType::BF16).path          // "avx512_bf16": how bf16 convolutions and GEMMs run here
#pragma once

#include <string>
#include <string_view>
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

// How the CPU's convolutions and GEMMs run bf16 operands:
//   F32         the operands convert to f32 around the f32 kernels (every CPU; correct, not faster);
//   Avx512Bf16  oneDNN's avx512_core_bf16 kernels: bf16 operands, f32 accumulation (vdpbf16ps);
//   Amx         oneDNN's AMX kernels where it has them (avx512_core_bf16 elsewhere).
// The default is the fastest this CPU has. RINGTRAIN_CPU_BF16 (auto, f32, avx512_bf16 or amx; read once)
// or set_cpu_bf16_path forces one; forcing a path this CPU lacks is an error naming the instruction.
// avx512_bf16 on an AMX CPU caps oneDNN at avx512_core_bf16 for the whole process, which oneDNN allows
// only before its first kernel: choose it through the environment. fp16 always takes the f32 path
// (bf16 is the CPU's mixed precision: fp16 needs loss scaling; docs/PERFORMANCE.md).
enum class Bf16Kernels { F32, Avx512Bf16, Amx };
Bf16Kernels cpu_bf16_kernels();
void set_cpu_bf16_path(std::string_view name);  // "auto", "f32", "avx512_bf16" or "amx"
const char* bf16_path_name(Bf16Kernels k);      // "f32", "avx512_bf16", "amx"

// The path a 16-bit type (BF16 or F16) takes on this machine, and why; the plan record and ringtrain_env
// print it. The why names the instructions this CPU has for the type, or that it has none.
struct HalfPath {
  std::string path, why;
};
HalfPath cpu_half_path(DType dtype);

}  // namespace ringtrain
