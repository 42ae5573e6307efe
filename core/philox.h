// core/philox.h: Philox4x32-10, a counter-based RNG (Salmon et al., SC'11). A random value is a pure
// function of (seed, element index, stream), so results never depend on thread count, chunking or
// device. Usable from host and CUDA device code.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace ringtrain {

struct Philox4 {
  uint32_t v[4];
};

RT_HOST_DEVICE inline uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

// counter: (block index low, block index high, stream low, stream high); key: the seed.
RT_HOST_DEVICE inline Philox4 philox4x32_10(uint64_t seed, uint64_t block, uint64_t stream) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo32(kMul0, c0, &hi0);
    uint32_t lo1 = mulhilo32(kMul1, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform in (0, 1]: never 0, so log() in Box-Muller is safe.
RT_HOST_DEVICE inline float u32_to_unit_float(uint32_t x) {
  return (static_cast<float>(x >> 8) + 1.0f) * (1.0f / 16777216.0f);
}
RT_HOST_DEVICE inline double u32_to_unit_double(uint32_t a, uint32_t b) {
  uint64_t bits = (static_cast<uint64_t>(a) << 21) ^ static_cast<uint64_t>(b >> 11);  // 53 bits
  return (static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) + 1.0) * (1.0 / 9007199254740992.0);
}

// The element-index -> value mapping every device implements identically.
// uniform: element i uses word i%4 of block i/4. normal: element i uses words 2*(i%2), 2*(i%2)+1 of
// block i/2 (Box-Muller, cos branch for even, sin branch for odd would couple elements; we use the
// cos branch of its own pair so each element is independent of its neighbours).
RT_HOST_DEVICE inline float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  Philox4 r = philox4x32_10(seed, index >> 2, stream);
  return u32_to_unit_float(r.v[index & 3]);
}
RT_HOST_DEVICE inline double philox_uniform_f64(uint64_t seed, uint64_t stream, uint64_t index) {
  Philox4 r = philox4x32_10(seed, index >> 1, stream);
  unsigned w = static_cast<unsigned>(index & 1) * 2;
  return u32_to_unit_double(r.v[w], r.v[w + 1]);
}

}  // namespace ringtrain
