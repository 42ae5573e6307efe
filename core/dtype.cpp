// core/dtype.cpp: parsing dtype names.
#include "core/dtype.h"

#include "core/check.h"

namespace ringtrain {

DType parse_dtype(std::string_view text) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::F32},   {"float32", DType::F32},   {"float", DType::F32},  {"fp32", DType::F32},
      {"f64", DType::F64},   {"float64", DType::F64},   {"double", DType::F64}, {"fp64", DType::F64},
      {"f16", DType::F16},   {"float16", DType::F16},   {"half", DType::F16},   {"fp16", DType::F16},
      {"bf16", DType::BF16}, {"bfloat16", DType::BF16}, {"i32", DType::I32},    {"int32", DType::I32},
      {"i64", DType::I64},   {"int64", DType::I64},     {"u8", DType::U8},      {"uint8", DType::U8},
  };
  for (const auto& alias : kAliases)
    if (alias.name == text) return alias.dtype;
  RT_THROW("unknown dtype '", text, "' (expected one of f32, f64, f16, bf16, i32, i64, u8)");
}

}  // namespace ringtrain
