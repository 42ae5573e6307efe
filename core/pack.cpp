#include "core/pack.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <string_view>

#include "core/check.h"
#include "core/parallel.h"

namespace ringtrain {

namespace {

constexpr int64_t kBlock = 4096;  // elements a task packs; a multiple of 64 (its mask words are its own)
constexpr int64_t kGrain = 4;     // blocks per task at least
constexpr int64_t kPadding = 16;  // elements after the values: a 16-wide load at the end stays inside

// ---- the AVX2 path's tables, for the 8 lanes of one mask byte m
struct Lanes {
  alignas(32) std::array<std::array<uint32_t, 8>, 256> compress{};  // [m][k]: lane of m's k-th set bit
  alignas(32) std::array<std::array<uint32_t, 8>, 256> expand{};    // [m][i]: set bits of m below lane i
  alignas(32) std::array<std::array<uint32_t, 8>, 256> keep{};      // [m][i]: all ones where bit i is set
  Lanes() {
    for (uint32_t m = 0; m < 256; ++m) {
      uint32_t k = 0;
      for (uint32_t i = 0; i < 8; ++i) {
        expand[m][i] = k;
        if ((m >> i) & 1U) {
          compress[m][k++] = i;
          keep[m][i] = ~0U;
        }
      }
    }
  }
};
const Lanes& lanes() {
  static const Lanes table;
  return table;
}

// Runs fn(i, len) for each block [i, i + len) of n elements, blocks spread over the worker threads.
void for_blocks(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_for((n + kBlock - 1) / kBlock, kGrain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(b * kBlock, std::min(kBlock, n - b * kBlock));
  });
}

// ---- plain C++: any element type
// Bit j % 64 of word j / 64 set where keep(x[j]); returns how many are set.
template <typename U, typename Keep>
int64_t bits_generic(const U* x, int64_t n, uint64_t* mask, Keep keep) {
  int64_t count = 0;
  for (int64_t w = 0; w * 64 < n; ++w) {
    const int64_t len = std::min<int64_t>(64, n - w * 64);
    uint64_t bits = 0;
    for (int64_t j = 0; j < len; ++j) bits |= static_cast<uint64_t>(keep(x[w * 64 + j])) << j;
    mask[w] = bits;
    count += __builtin_popcountll(bits);
  }
  return count;
}

template <typename U>
int64_t mask_generic(const U* x, int64_t n, uint64_t* mask) {
  return bits_generic(x, n, mask, [](U v) { return v != 0; });
}

int64_t positive_generic(const float* y, int64_t n, uint64_t* bits) {
  return bits_generic(y, n, bits, [](float v) { return v > 0.0F; });
}

// The nonzeros of x[0, n) to out, in order; out may be x or lie below it (each store lands at or below the
// element just read).
template <typename U>
void compact_generic(const U* x, int64_t n, U* out) {
  int64_t pos = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] != 0) out[pos++] = x[i];
}

// out[i, n) from values[pos] on, by the mask's bits: the plain loop, and the vector loops' tail.
template <typename U>
void expand_from(const U* values, int64_t pos, int64_t i, int64_t n, const uint64_t* mask, U* out) {
  for (; i < n; ++i) {
    const bool set = (mask[i / 64] >> (i % 64)) & 1U;
    out[i] = set ? values[pos] : U{0};
    pos += set;
  }
}

template <typename U>
void expand_generic(const U* values, int64_t n, const uint64_t* mask, U* out) {
  expand_from(values, 0, 0, n, mask, out);
}

// ---- AVX2: 4-byte elements, 8 lanes at a time
__attribute__((target("avx2,popcnt"))) int64_t mask32_avx2(const uint32_t* x, int64_t n, uint64_t* mask) {
  const __m256i zero = _mm256_setzero_si256();
  int64_t count = 0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t bits = 0;
    for (int g = 0; g < 8; ++g) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8 * g));
      const int zeros = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, zero)));
      bits |= static_cast<uint64_t>(~zeros & 0xFF) << (8 * g);
    }
    mask[i / 64] = bits;
    count += _mm_popcnt_u64(bits);
  }
  if (i < n) count += mask_generic(x + i, n - i, mask + i / 64);
  return count;
}

// Compacts a block's nonzeros to out (x itself or below it): a full-width store at out + pos (pos <= i)
// never reaches an element not yet loaded.
__attribute__((target("avx2,popcnt"))) void compact32_avx2(const uint32_t* x, int64_t n, const uint64_t* mask,
                                                           uint32_t* out) {
  const Lanes& t = lanes();
  int64_t pos = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint32_t m = (mask[i / 64] >> (i % 64)) & 0xFFU;
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.compress[m].data()));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + pos), _mm256_permutevar8x32_epi32(v, idx));
    pos += _mm_popcnt_u32(m);
  }
  compact_generic(x + i, n - i, out + pos);
}

__attribute__((target("avx2,popcnt"))) void expand32_avx2(const uint32_t* values, int64_t n, const uint64_t* mask,
                                                          uint32_t* out) {
  const Lanes& t = lanes();
  int64_t pos = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint32_t m = (mask[i / 64] >> (i % 64)) & 0xFFU;
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + pos));
    const __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.expand[m].data()));
    const __m256i keep = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.keep[m].data()));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_and_si256(_mm256_permutevar8x32_epi32(v, idx), keep));
    pos += _mm_popcnt_u32(m);
  }
  expand_from(values, pos, i, n, mask, out);
}

__attribute__((target("avx2"))) void positive_bits_avx2(const float* y, int64_t n, uint64_t* bits) {
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t word = 0;
    for (int g = 0; g < 8; ++g) {
      const __m256 v = _mm256_loadu_ps(y + i + 8 * g);
      word |= static_cast<uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_GT_OQ))) << (8 * g);
    }
    bits[i / 64] = word;
  }
  if (i < n) positive_generic(y + i, n - i, bits + i / 64);
}

__attribute__((target("avx2"))) void mask_by_bits_avx2(const float* dy, int64_t n, const uint64_t* bits, float* out) {
  const Lanes& t = lanes();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint32_t m = (bits[i / 64] >> (i % 64)) & 0xFFU;
    const __m256 keep = _mm256_load_ps(reinterpret_cast<const float*>(t.keep[m].data()));
    _mm256_storeu_ps(out + i, _mm256_and_ps(_mm256_loadu_ps(dy + i), keep));
  }
  for (; i < n; ++i) out[i] = (bits[i / 64] >> (i % 64)) & 1U ? dy[i] : 0.0F;
}

// ---- AVX-512: 4-byte elements, 16 lanes at a time, the masks straight from the compares and the
// compress/expand instructions (register forms: their memory forms are microcoded on some CPUs)
__attribute__((target("avx512f,popcnt"))) int64_t mask32_avx512(const uint32_t* x, int64_t n, uint64_t* mask) {
  int64_t count = 0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t bits = 0;
    for (int g = 0; g < 4; ++g) {
      const __m512i v = _mm512_loadu_si512(x + i + 16 * g);
      bits |= static_cast<uint64_t>(_mm512_test_epi32_mask(v, v)) << (16 * g);
    }
    mask[i / 64] = bits;
    count += _mm_popcnt_u64(bits);
  }
  if (i < n) count += mask_generic(x + i, n - i, mask + i / 64);
  return count;
}

__attribute__((target("avx512f,popcnt"))) void compact32_avx512(const uint32_t* x, int64_t n, const uint64_t* mask,
                                                                uint32_t* out) {
  int64_t pos = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const auto m = static_cast<__mmask16>((mask[i / 64] >> (i % 64)) & 0xFFFFU);
    const __m512i v = _mm512_loadu_si512(x + i);
    _mm512_storeu_si512(out + pos, _mm512_maskz_compress_epi32(m, v));
    pos += _mm_popcnt_u32(m);
  }
  compact_generic(x + i, n - i, out + pos);
}

// A 16-wide load at values + pos reads past the block's values into the next block's or the padding.
__attribute__((target("avx512f,popcnt"))) void expand32_avx512(const uint32_t* values, int64_t n, const uint64_t* mask,
                                                               uint32_t* out) {
  int64_t pos = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const auto m = static_cast<__mmask16>((mask[i / 64] >> (i % 64)) & 0xFFFFU);
    _mm512_storeu_si512(out + i, _mm512_maskz_expand_epi32(m, _mm512_loadu_si512(values + pos)));
    pos += _mm_popcnt_u32(m);
  }
  expand_from(values, pos, i, n, mask, out);
}

__attribute__((target("avx512f"))) void positive_bits_avx512(const float* y, int64_t n, uint64_t* bits) {
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t word = 0;
    for (int g = 0; g < 4; ++g)
      word |= static_cast<uint64_t>(_mm512_cmp_ps_mask(_mm512_loadu_ps(y + i + 16 * g), zero, _CMP_GT_OQ)) << (16 * g);
    bits[i / 64] = word;
  }
  if (i < n) positive_generic(y + i, n - i, bits + i / 64);
}

__attribute__((target("avx512f"))) void mask_by_bits_avx512(const float* dy, int64_t n, const uint64_t* bits,
                                                            float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const auto m = static_cast<__mmask16>((bits[i / 64] >> (i % 64)) & 0xFFFFU);
    _mm512_storeu_ps(out + i, _mm512_maskz_mov_ps(m, _mm512_loadu_ps(dy + i)));
  }
  for (; i < n; ++i) out[i] = (bits[i / 64] >> (i % 64)) & 1U ? dy[i] : 0.0F;
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("popcnt");
}

enum class Isa : int { kGeneric, kAvx2, kAvx512 };

std::atomic<Isa>& isa() {
  static std::atomic<Isa> chosen{cpu_has_avx512() ? Isa::kAvx512 : cpu_has_avx2() ? Isa::kAvx2 : Isa::kGeneric};
  return chosen;
}

// Each pass on one block, by the ISA in use: the vector paths for 4-byte elements, the plain loops for the
// rest.
template <typename U>
int64_t mask_block(const U* x, int64_t n, uint64_t* mask, Isa path) {
  if constexpr (sizeof(U) == 4) {
    if (path == Isa::kAvx512) return mask32_avx512(x, n, mask);
    if (path == Isa::kAvx2) return mask32_avx2(x, n, mask);
  }
  return mask_generic(x, n, mask);
}
template <typename U>
void compact_block(const U* x, int64_t n, const uint64_t* mask, U* out, Isa path) {
  if constexpr (sizeof(U) == 4) {
    if (path == Isa::kAvx512) return compact32_avx512(x, n, mask, out);
    if (path == Isa::kAvx2) return compact32_avx2(x, n, mask, out);
  }
  compact_generic(x, n, out);
}
template <typename U>
void expand_block(const U* values, int64_t n, const uint64_t* mask, U* out, Isa path) {
  if constexpr (sizeof(U) == 4) {
    if (path == Isa::kAvx512) return expand32_avx512(values, n, mask, out);
    if (path == Isa::kAvx2) return expand32_avx2(values, n, mask, out);
  }
  expand_generic(values, n, mask, out);
}

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

template <typename U>
std::optional<PackedZeros> pack_typed(Tensor& t, double max_density) {
  const int64_t n = t.numel();
  U* x = static_cast<U*>(t.data_ptr());
  const int64_t blocks = (n + kBlock - 1) / kBlock, words = (n + 63) / 64;
  std::vector<int64_t> offsets(blocks + 1, 0);
  Tensor mask_tensor = Tensor::empty(Shape{words * 8}, DType::U8);  // until the values are in place
  uint64_t* mask = mask_tensor.data<uint64_t>();
  const Isa path = isa().load();
  for_blocks(n, [&](int64_t i, int64_t len) { offsets[i / kBlock + 1] = mask_block(x + i, len, mask + i / 64, path); });
  for (int64_t b = 0; b < blocks; ++b) offsets[b + 1] += offsets[b];
  const int64_t nonzeros = offsets.back();
  const int64_t mask_offset = round_up((nonzeros + kPadding) * static_cast<int64_t>(sizeof(U)), 64);
  const int64_t packed_bytes = mask_offset + words * 8;
  if (static_cast<double>(nonzeros) > max_density * static_cast<double>(n) || packed_bytes >= t.nbytes())
    return std::nullopt;
  // The blocks in one run per thread: each run compacts its blocks in order to the run's start (every
  // store lands at or below what was just read); then, in order, each run down to where it belongs (its
  // place ends before any later run's values begin, so nothing not yet moved is overwritten). One move
  // per run, not per block: the moves are serial.
  const int64_t runs = std::min<int64_t>(num_threads(), blocks);
  auto run_start = [&](int64_t r) { return blocks * r / runs; };
  parallel_for(runs, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      U* out = x + run_start(r) * kBlock;
      for (int64_t b = run_start(r); b < run_start(r + 1); ++b) {
        const int64_t i = b * kBlock;
        compact_block(x + i, std::min(kBlock, n - i), mask + i / 64, out, path);
        out += offsets[b + 1] - offsets[b];
      }
    }
  });
  for (int64_t r = 1; r < runs; ++r) {
    const int64_t b0 = run_start(r), b1 = run_start(r + 1);
    std::memmove(x + offsets[b0], x + b0 * kBlock, static_cast<size_t>(offsets[b1] - offsets[b0]) * sizeof(U));
  }
  std::memset(x + nonzeros, 0, static_cast<size_t>(mask_offset) - static_cast<size_t>(nonzeros) * sizeof(U));
  auto* base = reinterpret_cast<char*>(x);
  std::memcpy(base + mask_offset, mask, static_cast<size_t>(words) * 8);

  PackedZeros p;
  p.shape = t.shape();
  p.dtype = t.dtype();
  p.mask_offset = mask_offset;
  p.offsets = std::move(offsets);
  const TensorImpl* dense = t.impl();
  dense->storage->shrink(dense->offset_bytes + packed_bytes);
  auto bytes = std::make_shared<TensorImpl>();
  bytes->storage = dense->storage;
  bytes->offset_bytes = dense->offset_bytes;
  bytes->shape = Shape{packed_bytes};
  bytes->dtype = DType::U8;
  p.bytes = Tensor(std::move(bytes));
  t = Tensor();
  return p;
}

template <typename U>
void unpack_typed(const PackedZeros& p, Tensor& out) {
  const int64_t n = out.numel();
  const auto* base = static_cast<const char*>(p.bytes.data_ptr());
  const U* values = reinterpret_cast<const U*>(base);
  const uint64_t* mask = reinterpret_cast<const uint64_t*>(base + p.mask_offset);
  U* y = out.data<U>();
  const Isa path = isa().load();
  for_blocks(n, [&](int64_t i, int64_t len) {
    expand_block(values + p.offsets[i / kBlock], len, mask + i / 64, y + i, path);
  });
}

}  // namespace

int64_t PackedZeros::nbytes() const {
  return (bytes.defined() ? bytes.nbytes() : 0) + static_cast<int64_t>(offsets.size() * sizeof(int64_t));
}

std::optional<PackedZeros> pack_zeros(Tensor& t, double max_density) {
  if (!t.defined() || t.released() || t.device() != Device::cpu() || t.numel() == 0) return std::nullopt;
  if (dtype_size(t.dtype()) != 4 && dtype_size(t.dtype()) != 2) return std::nullopt;
  RT_CHECK(t.sole_owner(), "pack_zeros: ", t.describe(),
           " shares its memory with another tensor; it is packed in place, so it must be the only handle");
  if (dtype_size(t.dtype()) == 4) return pack_typed<uint32_t>(t, max_density);
  return pack_typed<uint16_t>(t, max_density);
}

Tensor unpack_zeros(const PackedZeros& packed) {
  RT_CHECK(packed.bytes.defined() && !packed.offsets.empty(), "unpack_zeros: an empty PackedZeros");
  Tensor out = Tensor::empty(packed.shape, packed.dtype);
  if (dtype_size(packed.dtype) == 4) {
    unpack_typed<uint32_t>(packed, out);
  } else {
    unpack_typed<uint16_t>(packed, out);
  }
  return out;
}

Tensor positive_bits(const Tensor& y) {
  RT_CHECK(y.defined() && y.device().is_cpu() && y.dtype() == DType::F32,
           "positive_bits: ", y.defined() ? y.describe() : std::string("an undefined tensor"), " is no f32 CPU tensor");
  const int64_t n = y.numel();
  Tensor bits = Tensor::empty(Shape{(n + 63) / 64 * 8}, DType::U8);
  const float* py = y.data<float>();
  uint64_t* pb = bits.data<uint64_t>();
  const Isa path = isa().load();
  for_blocks(n, [&](int64_t i, int64_t len) {
    if (path == Isa::kAvx512) {
      positive_bits_avx512(py + i, len, pb + i / 64);
    } else if (path == Isa::kAvx2) {
      positive_bits_avx2(py + i, len, pb + i / 64);
    } else {
      positive_generic(py + i, len, pb + i / 64);
    }
  });
  return bits;
}

void mask_by_bits(const Tensor& dy, const Tensor& bits, const Tensor& out) {
  RT_CHECK(dy.device().is_cpu() && dy.dtype() == DType::F32 && out.dtype() == DType::F32 && out.numel() == dy.numel() &&
               bits.nbytes() == (dy.numel() + 63) / 64 * 8,
           "mask_by_bits: ", dy.describe(), " and ", out.describe(), " with ", bits.describe(), " of mask");
  const int64_t n = dy.numel();
  const float* g = dy.data<float>();
  const uint64_t* pb = bits.data<uint64_t>();
  float* po = out.data<float>();
  const Isa path = isa().load();
  for_blocks(n, [&](int64_t i, int64_t len) {
    if (path == Isa::kAvx512) {
      mask_by_bits_avx512(g + i, len, pb + i / 64, po + i);
    } else if (path == Isa::kAvx2) {
      mask_by_bits_avx2(g + i, len, pb + i / 64, po + i);
    } else {
      for (int64_t j = i; j < i + len; ++j) po[j] = (pb[j / 64] >> (j % 64)) & 1U ? g[j] : 0.0F;
    }
  });
}

namespace detail {

const char* pack_isa() {
  switch (isa().load()) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kGeneric:
      break;
  }
  return "generic";
}

void set_pack_isa(const char* name) {
  const std::string_view path(name);
  if (path == "generic") {
    isa() = Isa::kGeneric;
  } else if (path == "avx2") {
    RT_CHECK(cpu_has_avx2(), "set_pack_isa: this CPU has no AVX2");
    isa() = Isa::kAvx2;
  } else if (path == "avx512") {
    RT_CHECK(cpu_has_avx512(), "set_pack_isa: this CPU has no AVX-512");
    isa() = Isa::kAvx512;
  } else {
    RT_THROW("set_pack_isa: unknown path '", path, "' (avx512, avx2 or generic)");
  }
}

}  // namespace detail

}  // namespace ringtrain
