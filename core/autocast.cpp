#include "core/autocast.h"

#include "core/check.h"

namespace ringtrain {
namespace {
thread_local std::optional<DType> t_autocast;
}

AutocastGuard::AutocastGuard(std::optional<DType> dtype) : previous_(t_autocast) {
  RT_CHECK(!dtype || *dtype == DType::BF16 || *dtype == DType::F16,
           "AutocastGuard: autocast dtype must be bf16 or f16, got ", dtype_name(*dtype));
  t_autocast = dtype;
}

AutocastGuard::~AutocastGuard() { t_autocast = previous_; }

std::optional<DType> autocast_dtype() { return t_autocast; }

}  // namespace ringtrain
