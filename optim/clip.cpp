// optim/clip.cpp: the exact gradient norm (two passes: the largest |x|, then fixed-point squares).
#include "optim/clip.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "core/autograd.h"
#include "core/check.h"
#include "core/dispatch.h"
#include "core/kernels.h"
#include "optim/optimizer.h"  // FusionKey

namespace ringtrain {
namespace {

// The gradients by (device, dtype): one kernel call per group.
std::map<FusionKey, std::vector<Tensor*>> groups_of(std::vector<Tensor>& grads) {
  std::map<FusionKey, std::vector<Tensor*>> groups;
  for (Tensor& g : grads) {
    RT_CHECK(is_floating(g.dtype()), "grad_norm: gradients must be floating, got ", g.describe());
    if (g.numel() > 0) groups[fusion_key(g)].push_back(&g);
  }
  return groups;
}

std::vector<Tensor> gradients_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  out.reserve(params.size());
  for (const Tensor& p : params)
    if (Tensor g = p.grad(); g.defined()) out.push_back(std::move(g));
  return out;
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params, const GradientParts* parts) {
  NoGradGuard no_grad;
  std::vector<Tensor> grads = gradients_of(params);
  const auto groups = groups_of(grads);
  // Pass 1: the largest |x| (as f32 bits: NaN > inf > finite), over every device and part.
  uint64_t top = 0;
  {
    std::vector<Tensor> outs;
    for (const auto& [key, group] : groups) {
      const Device device = group.front()->device();
      outs.push_back(Tensor::zeros(Shape{}, DType::I32, device));
      RT_KERNEL(device, "grad_norm", abs_max_multi_tensor)(group, outs.back());
      detail::after_op(device, "grad_norm");
    }
    for (const Tensor& o : outs) top = std::max<uint64_t>(top, static_cast<uint64_t>(o.item()));
  }
  if (parts) parts->max(std::span<uint64_t>(&top, 1));
  float largest = 0;
  const uint32_t bits = static_cast<uint32_t>(top);
  std::memcpy(&largest, &bits, sizeof largest);
  if (!std::isfinite(largest)) return static_cast<double>(largest);
  if (largest == 0) return 0.0;
  // Pass 2: floor(x^2 * 2^(58 - 2e)) with |x| <= largest < 2^e: every term is below 2^58 (2^61 for f64
  // gradients rounded down to f32 above), so 2^32 elements fit the 64-bit sums of the halves.
  int e = 0;
  std::frexp(static_cast<double>(largest), &e);
  const int shift = 58 - 2 * e;
  const double scale = std::ldexp(1.0, shift);
  uint64_t sums[2] = {0, 0};
  {
    std::vector<Tensor> outs;
    for (const auto& [key, group] : groups) {
      const Device device = group.front()->device();
      outs.push_back(Tensor::zeros(Shape{2}, DType::I64, device));
      RT_KERNEL(device, "grad_norm", square_sum_multi_tensor)(group, scale, outs.back());
      detail::after_op(device, "grad_norm");
    }
    for (const Tensor& o : outs) {
      const Tensor host = o.device().is_cpu() ? o : o.to(Device::cpu());
      const auto* v = reinterpret_cast<const uint64_t*>(host.data<int64_t>());
      sums[0] += v[0];
      sums[1] += v[1];
    }
  }
  if (parts) parts->sum(std::span<uint64_t>(sums, 2));
  const unsigned __int128 total = (static_cast<unsigned __int128>(sums[1]) << 32) + sums[0];
  return std::sqrt(std::ldexp(static_cast<double>(total), -shift));
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, const GradientParts* parts) {
  RT_CHECK(max_norm > 0 && std::isfinite(max_norm), "clip_grad_norm: max_norm must be positive and finite, got ",
           max_norm);
  const double norm = grad_norm(params, parts);
  if (!std::isfinite(norm)) return norm;
  const double factor = max_norm / (norm + 1e-6);
  if (factor < 1) {
    NoGradGuard no_grad;
    for (Tensor& g : gradients_of(params)) g.mul_(factor);
  }
  return norm;
}

}  // namespace ringtrain
