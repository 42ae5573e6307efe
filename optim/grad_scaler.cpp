#include "optim/grad_scaler.h"

#include <cmath>
#include <map>
#include <string>

#include "core/autograd.h"
#include "core/check.h"
#include "core/dispatch.h"
#include "core/kernels.h"
#include "core/ops.h"

namespace ringtrain {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  RT_CHECK(options_.init_scale > 0 && std::isfinite(options_.init_scale),
           "GradScaler: init_scale must be positive, got ", options_.init_scale);
  RT_CHECK(options_.growth_factor > 1, "GradScaler: growth_factor must be > 1, got ", options_.growth_factor);
  RT_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1,
           "GradScaler: backoff_factor must be in (0, 1), got ", options_.backoff_factor);
  RT_CHECK(options_.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", options_.growth_interval);
}

Tensor GradScaler::scale_loss(const Tensor& loss) const { return mul(loss, scale_); }

bool GradScaler::unscale(const std::vector<Tensor>& params, const GradientParts* parts) const {
  NoGradGuard no_grad;
  // One fused kernel call per (device, dtype) group divides and checks in the same pass; each device's
  // found-inf flag is read once, after every group has been launched.
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const Tensor& p : params)
    if (Tensor g = p.grad(); g.defined()) grads.push_back(std::move(g));
  std::map<FusionKey, std::vector<Tensor*>> groups;
  for (Tensor& g : grads) groups[fusion_key(g)].push_back(&g);
  std::map<std::string, Tensor> found_inf;
  for (const auto& [key, group] : groups) {
    const Device device = group.front()->device();
    Tensor& flag = found_inf[device.str()];
    if (!flag.defined()) flag = Tensor::zeros(Shape{}, DType::F32, device);
    RT_KERNEL(device, "unscale", unscale_multi_tensor)(group, 1.0 / scale_, flag);
    detail::after_op(device, "unscale");
  }
  bool finite = true;
  for (const auto& [device, flag] : found_inf) finite = finite && flag.item() == 0.0;
  if (parts) {
    uint64_t bad = finite ? 0 : 1;
    parts->max(std::span<uint64_t>(&bad, 1));
    finite = bad == 0;
  }
  return finite;
}

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

bool GradScaler::step(Optimizer& optimizer, const std::vector<Tensor>& params, double lr, const GradientParts* parts) {
  const bool finite = unscale(params, parts);
  if (finite) optimizer.step(lr);
  update(!finite);
  return finite;
}

void GradScaler::load(double scale, int64_t growth_tracker) {
  RT_CHECK(scale > 0 && std::isfinite(scale), "GradScaler::load: scale must be positive and finite, got ", scale);
  RT_CHECK(growth_tracker >= 0, "GradScaler::load: growth tracker must be >= 0, got ", growth_tracker);
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace ringtrain
