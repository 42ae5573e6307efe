#include "core/optim/grad_scaler.h"

#include <cmath>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"

namespace ringtrain {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  RT_CHECK(options_.init_scale > 0 && std::isfinite(options_.init_scale), "GradScaler: init_scale must be positive, got ",
           options_.init_scale);
  RT_CHECK(options_.growth_factor > 1, "GradScaler: growth_factor must be > 1, got ", options_.growth_factor);
  RT_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1, "GradScaler: backoff_factor must be in (0, 1), got ",
           options_.backoff_factor);
  RT_CHECK(options_.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", options_.growth_interval);
}

Tensor GradScaler::scale_loss(const Tensor& loss) const { return mul(loss, scale_); }

bool GradScaler::unscale(const std::vector<Tensor>& params) const {
  NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  // sum(g * 0) is 0 for a finite gradient and NaN as soon as one element is inf or NaN: accumulated over
  // every gradient (on its device), then read once.
  double flag = 0;
  Tensor acc;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    g.mul_(inv);
    Tensor probe = sum(mul(g, 0.0)).to(DType::F64);
    if (acc.defined() && acc.device() != probe.device()) {
      flag += acc.item();
      acc = Tensor();
    }
    acc = acc.defined() ? add(acc, probe) : probe;
  }
  if (acc.defined()) flag += acc.item();
  return std::isfinite(flag);
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

bool GradScaler::step(Optimizer& optimizer, const std::vector<Tensor>& params, double lr) {
  const bool finite = unscale(params);
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
