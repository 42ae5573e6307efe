// core/dtype.h: element types, their sizes and names, and host-side f16/bf16 <-> f32 conversion.
// The conversion functions are also usable from CUDA device code (RT_HOST_DEVICE).
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define RT_HOST_DEVICE __host__ __device__
#else
#define RT_HOST_DEVICE
#endif

namespace ringtrain {

enum class DType : uint8_t { F32, F64, F16, BF16, I32, I64, U8 };
inline constexpr int kNumDTypes = 7;

constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
    case DType::F16:
      return 2;
    case DType::BF16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::U8:
      return "u8";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

constexpr bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}

// Parses "f32", "float32", "bf16", ...; throws ringtrain::Error naming the text otherwise.
DType parse_dtype(std::string_view text);

// IEEE binary16 and bfloat16 stored as raw bits. Arithmetic is always done in f32.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

RT_HOST_DEVICE inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
RT_HOST_DEVICE inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even; NaN stays NaN (quiet), overflow goes to inf.
RT_HOST_DEVICE inline BFloat16 f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>((u + rounding) >> 16)};
}
RT_HOST_DEVICE inline float bf16_to_f32(BFloat16 h) { return bits_f32(static_cast<uint32_t>(h.bits) << 16); }

RT_HOST_DEVICE inline Half f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Half{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
#if defined(__CUDA_ARCH__)
  // On the GPU the hardware conversion (cvt.rn.f16.f32: round to nearest even, subnormals kept, overflow
  // to inf) gives the bits of the code below for every other input, in one instruction instead of ~40.
  return Half{__half_as_ushort(__float2half_rn(f))};
#else
  if (abs >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> inf
  if (abs < 0x38800000u) {                                                     // subnormal or zero in f16
    // Shift the implicit-1 mantissa into the subnormal position, rounding to nearest even.
    if (abs < 0x33000000u) return Half{static_cast<uint16_t>(sign)};
    uint32_t exponent = abs >> 23;
    uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exponent;  // 14..24
    uint32_t half_mant = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (half_mant & 1u))) ++half_mant;
    return Half{static_cast<uint16_t>(sign | half_mant)};
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return Half{static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
#endif
}

RT_HOST_DEVICE inline float f16_to_f32(Half h) {
#if defined(__CUDA_ARCH__)
  // The hardware conversion (exact, subnormals included) except for NaN, whose payload the code below keeps.
  if ((h.bits & 0x7c00u) != 0x7c00u || (h.bits & 0x3ffu) == 0) return __half2float(__ushort_as_half(h.bits));
#endif
  uint32_t sign = (static_cast<uint32_t>(h.bits) & 0x8000u) << 16;
  uint32_t exponent = (h.bits >> 10) & 0x1fu;
  uint32_t mantissa = h.bits & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0) return bits_f32(sign);
    // Subnormal: value = mantissa * 2^-24.
    float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -value : value;
  }
  if (exponent == 31) return bits_f32(sign | 0x7f800000u | (mantissa << 13));
  return bits_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// The type kernels compute in for storage type S: f32 for f32 and the 16-bit floats, f64 for f64,
// i64 for every integer type. Shared by the CPU and CUDA kernels so both round the same way.
template <typename S>
using compute_t =
    std::conditional_t<std::is_same_v<S, double>, double, std::conditional_t<std::is_integral_v<S>, int64_t, float>>;

// Loads any storage type as the compute type C (float for the 16-bit types) and stores back.
template <typename C, typename S>
RT_HOST_DEVICE inline C load_as(S v) {
  if constexpr (std::is_same_v<S, Half>)
    return static_cast<C>(f16_to_f32(v));
  else if constexpr (std::is_same_v<S, BFloat16>)
    return static_cast<C>(bf16_to_f32(v));
  else
    return static_cast<C>(v);
}
template <typename S, typename C>
RT_HOST_DEVICE inline S store_as(C v) {
  if constexpr (std::is_same_v<S, Half>)
    return f32_to_f16(static_cast<float>(v));
  else if constexpr (std::is_same_v<S, BFloat16>)
    return f32_to_bf16(static_cast<float>(v));
  else
    return static_cast<S>(v);
}

}  // namespace ringtrain
