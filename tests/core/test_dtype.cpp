// Tests for core/dtype.h: sizes, names, parsing, and f16/bf16 conversion (rounding, specials).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/dtype.h"

namespace ringtrain {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4);
  EXPECT_EQ(dtype_size(DType::F64), 8);
  EXPECT_EQ(dtype_size(DType::F16), 2);
  EXPECT_EQ(dtype_size(DType::BF16), 2);
  EXPECT_EQ(dtype_size(DType::I32), 4);
  EXPECT_EQ(dtype_size(DType::I64), 8);
  EXPECT_EQ(dtype_size(DType::U8), 1);
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  }
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_TRUE(is_floating(DType::BF16));
  EXPECT_FALSE(is_floating(DType::I64));
}

TEST(DType, ParseErrorNamesTheText) {
  try {
    parse_dtype("float8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'float8'"), std::string::npos);
  }
}

TEST(DType, HalfRoundTripsEveryFiniteValue) {
  // Every finite f16 converts to f32 and back unchanged.
  int checked = 0;
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    Half h{static_cast<uint16_t>(bits)};
    float f = f16_to_f32(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f).bits, h.bits) << "bits " << bits;
    ++checked;
  }
  EXPECT_GT(checked, 63000);
}

TEST(DType, HalfRoundsToNearestEvenAndSaturatesToInf) {
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f)), 1.0f);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even -> 1.
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 0.00048828125f)), 1.0f);
  // Slightly above halfway rounds up.
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 0.0005f)), 1.0f + 0.0009765625f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  // Smallest subnormal 2^-24 and a value that underflows to zero.
  EXPECT_EQ(f16_to_f32(f32_to_f16(5.9604644775390625e-8f)), 5.9604644775390625e-8f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(1e-9f)), 0.0f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(-2.5f)), -2.5f);
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(3.140625f)), 3.140625f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.01171875f)), 1.015625f);  // 1 + 3*2^-8 -> ties to even 1 + 2^-6
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
}

}  // namespace
}  // namespace ringtrain
