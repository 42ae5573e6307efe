// optim/optimizer.cpp: update rules written with tensor ops (any device), schedules, clipping.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>

#include "core/autograd.h"
#include "core/check.h"
#include "core/dispatch.h"
#include "core/ops.h"

namespace ringtrain {

std::vector<NamedParameter> as_named(const std::vector<std::pair<std::string, Tensor>>& params) {
  std::vector<NamedParameter> out;
  for (const auto& [name, t] : params) out.push_back({name, t});
  return out;
}

FusionKey fusion_key(const Tensor& t) { return {t.device().str(), static_cast<int>(t.dtype())}; }

Optimizer::Optimizer(std::vector<NamedParameter> params, double weight_decay, DecayPolicy policy)
    : params_(std::move(params)), weight_decay_(weight_decay), policy_(policy) {
  RT_CHECK(weight_decay >= 0, "optimizer: weight decay must be >= 0, got ", weight_decay);
  // A tensor listed twice would be updated twice per step, and by two blocks at once in a fused GPU launch.
  std::map<const void*, const std::string*> seen;
  std::map<std::string, int> names;
  for (const auto& p : params_) {
    RT_CHECK(p.tensor.defined() && p.tensor.requires_grad(), "optimizer: parameter '", p.name,
             "' must be a tensor that requires grad");
    RT_CHECK(is_floating(p.tensor.dtype()), "optimizer: parameter '", p.name, "' is ", p.tensor.describe());
    RT_CHECK(++names[p.name] == 1, "optimizer: parameter name '", p.name, "' is given twice");
    if (p.tensor.numel() == 0) continue;
    auto [it, fresh] = seen.emplace(p.tensor.data_ptr(), &p.name);
    RT_CHECK(fresh, "optimizer: parameters '", *it->second, "' and '", p.name, "' are the same tensor");
  }
}

namespace {
// The fused kernels trust that a parameter's state tensors match it; a model moved with to() after
// the optimizer made its state would otherwise hand them another device's memory.
void check_state_slot(const std::string& name, const char* slot, const Tensor& state, const Tensor& p) {
  RT_CHECK(state.dtype() == p.dtype() && state.device() == p.device() && state.numel() == p.numel(),
           "optimizer: state '", name, ".", slot, "' is ", state.describe(), " but the parameter is ", p.describe(),
           " (was the model moved after the optimizer took its first step? load_state() after moving)");
}
}  // namespace

bool Optimizer::decays(const Tensor& p) const {
  if (weight_decay_ == 0.0) return false;
  return policy_ == DecayPolicy::All || p.ndim() > 1;
}

std::string Optimizer::replayable() const { return "this optimizer has no replayable step (stage/apply)"; }
void Optimizer::stage(double) { RT_THROW("optimizer: ", replayable()); }
void Optimizer::apply() { RT_THROW("optimizer: ", replayable()); }

void Optimizer::write_values(const std::vector<double>& values) {
  NoGradGuard no_grad;
  const Device device = params_.empty() ? Device::cpu() : params_.front().tensor.device();
  if (!values_.defined() || values_.device() != device || values_.numel() != static_cast<int64_t>(values.size()))
    values_ = Tensor::empty(Shape{static_cast<int64_t>(values.size())}, DType::F64, device);
  // A fill each, the value a kernel argument: ordered on the stream after the replay before, no host wait.
  for (size_t i = 0; i < values.size(); ++i)
    values_.slice(static_cast<int64_t>(i), static_cast<int64_t>(i) + 1).fill_(values[i]);
}

void Optimizer::check_staged(const char* rule) const {
  const std::string why = replayable();
  RT_CHECK(why.empty() && values_.defined(), rule, ": apply(): ", why.empty() ? "no stage() before it" : why);
}

std::string Optimizer::replayable_state(const std::vector<Tensor>& state, const char* slot) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].tensor;
    if (p.device() != params_.front().tensor.device())
      return detail::str_cat("parameters '", params_.front().name, "' and '", params_[i].name,
                             "' are on different devices");
    if (!p.grad().defined())
      return detail::str_cat("parameter '", params_[i].name, "' has no gradient (each update is captured once)");
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (slot && !state[i].defined())
      return detail::str_cat("parameter '", params_[i].name, "' has no ", slot,
                             " yet (its first update makes it; take a step() first)");
  }
  return "";
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& p : params_) p.tensor.zero_grad(set_to_none);
}

namespace {

using State = std::vector<std::pair<std::string, Tensor>>;

std::map<std::string, Tensor> index_state(const State& state) {
  std::map<std::string, Tensor> out;
  for (const auto& [n, t] : state) out[n] = t;
  return out;
}

int64_t read_step(const std::map<std::string, Tensor>& state) {
  auto it = state.find("step");
  if (it == state.end()) RT_THROW("optimizer state: missing entry 'step'");
  return static_cast<int64_t>(it->second.item());
}

// Copies state entry `key` into slot (allocating it like `like`), or leaves the slot empty if absent
// and `optional`.
void restore_slot(const std::map<std::string, Tensor>& state, const std::string& key, const Tensor& like,
                  Tensor& slot) {
  auto it = state.find(key);
  if (it == state.end()) {
    slot = Tensor();
    return;
  }
  if (!(it->second.shape() == like.shape()))
    RT_THROW("optimizer state: entry '", key, "' has shape ", it->second.shape(), ", the parameter is ", like.shape());
  slot = Tensor::empty(like.shape(), like.dtype(), like.device());
  slot.copy_(it->second);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// SGD: PyTorch's rule. g = grad + wd p; buf = momentum buf + (1 - dampening) g (buf = g at first);
// g = nesterov ? g + momentum buf : buf; p -= lr g.

Sgd::Sgd(std::vector<NamedParameter> params, SgdOptions options)
    : Optimizer(std::move(params), options.weight_decay, options.decay_policy), options_(options) {
  RT_CHECK(options.momentum >= 0, "SGD: momentum must be >= 0, got ", options.momentum);
  RT_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
           "SGD: Nesterov momentum needs momentum > 0 and no dampening");
  momentum_.resize(params_.size());
}

int64_t Sgd::state_bytes() const {
  int64_t bytes = 0;
  if (options_.momentum > 0)
    for (const auto& p : params_) bytes += p.tensor.nbytes();
  return bytes;
}

void Sgd::step(double lr) { launch(lr, false); }

std::string Sgd::replayable() const {
  return replayable_state(momentum_, options_.momentum != 0.0 ? "momentum" : nullptr);
}

void Sgd::stage(double lr) {
  const std::string why = replayable();
  RT_CHECK(why.empty(), "SGD: stage(): ", why);
  write_values({lr});
  ++steps_;
}

void Sgd::apply() {
  check_staged("SGD");
  launch(0.0, true);
}

void Sgd::launch(double lr, bool from_values) {
  NoGradGuard no_grad;
  // One fused kernel call per (device, dtype) group: one pass over each parameter instead of an op per
  // term, and on CUDA a few launches for the whole model.
  // New momentum buffers are kept aside until every launch has succeeded: a failed step leaves no
  // buffer that was never written looking like state.
  std::vector<Tensor> grads(params_.size()), momentum = momentum_;
  std::map<FusionKey, std::vector<SgdTensor>> groups;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i].tensor;
    grads[i] = p.grad();
    if (!grads[i].defined()) continue;
    SgdTensor t;
    t.param = &p;
    t.grad = &grads[i];
    t.weight_decay = decays(p) ? weight_decay_ : 0.0;
    if (options_.momentum != 0.0) {
      t.init_momentum = !momentum[i].defined();
      if (t.init_momentum) momentum[i] = Tensor::empty(p.shape(), p.dtype(), p.device());
      check_state_slot(params_[i].name, "momentum", momentum[i], p);
      t.momentum = &momentum[i];
    }
    groups[fusion_key(p)].push_back(t);
  }
  const SgdArgs args{lr, options_.momentum, options_.dampening, options_.nesterov, from_values ? &values_ : nullptr};
  for (const auto& [key, tensors] : groups) {
    const Device device = tensors.front().param->device();
    RT_KERNEL(device, "sgd", sgd_multi_tensor)(tensors, args);
    detail::after_op(device, "sgd");
  }
  momentum_ = std::move(momentum);
  if (!from_values) ++steps_;  // stage() counted it
}

State Sgd::state() const {
  State out;
  out.emplace_back("step", Tensor::scalar(static_cast<double>(steps_), DType::I64));
  for (size_t i = 0; i < params_.size(); ++i)
    if (momentum_[i].defined()) out.emplace_back(params_[i].name + ".momentum", momentum_[i]);
  return out;
}

void Sgd::load_state(const State& state) {
  auto index = index_state(state);
  const int64_t steps = read_step(index);
  std::vector<Tensor> momentum(params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    restore_slot(index, params_[i].name + ".momentum", params_[i].tensor, momentum[i]);
  steps_ = steps;
  momentum_ = std::move(momentum);
}

// ---------------------------------------------------------------------------------------------------
// AdamW: p -= lr wd p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).

AdamW::AdamW(std::vector<NamedParameter> params, AdamWOptions options)
    : Optimizer(std::move(params), options.weight_decay, options.decay_policy), options_(options) {
  RT_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
           "AdamW: betas must be in [0, 1), got ", options.beta1, ", ", options.beta2);
  RT_CHECK(options.eps > 0, "AdamW: eps must be > 0");
  m_.resize(params_.size());
  v_.resize(params_.size());
  param_steps_.assign(params_.size(), 0);
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : params_) bytes += 2 * p.tensor.nbytes();
  return bytes;
}

void AdamW::step(double lr) { launch(lr, false); }

std::string AdamW::replayable() const {
  std::string why = replayable_state(m_, "exp_avg");
  for (size_t i = 1; why.empty() && i < params_.size(); ++i)
    if (param_steps_[i] != param_steps_[0])
      why = detail::str_cat("parameters '", params_[0].name, "' and '", params_[i].name, "' have taken ",
                            param_steps_[0], " and ", param_steps_[i], " steps (their bias corrections differ)");
  return why;
}

void AdamW::stage(double lr) {
  const std::string why = replayable();
  RT_CHECK(why.empty(), "AdamW: stage(): ", why);
  for (int64_t& s : param_steps_) ++s;
  // step()'s figures for this step, computed as it computes them.
  const double t = static_cast<double>(param_steps_.empty() ? 1 : param_steps_[0]);
  write_values(
      {lr / (1.0 - std::pow(options_.beta1, t)), 1.0 / (1.0 - std::pow(options_.beta2, t)), 1.0 - lr * weight_decay_});
  ++steps_;
}

void AdamW::apply() {
  check_staged("AdamW");
  launch(0.0, true);
}

void AdamW::launch(double lr, bool from_values) {
  NoGradGuard no_grad;
  // One fused kernel call per (device, dtype) group, as for SGD: a single pass over p, g, m and v. New
  // moments and step counts are committed only once every launch has succeeded.
  std::vector<Tensor> grads(params_.size()), m = m_, v = v_;
  std::vector<int64_t> param_steps = param_steps_;
  std::map<FusionKey, std::vector<AdamWTensor>> groups;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i].tensor;
    grads[i] = p.grad();
    if (!grads[i].defined()) continue;
    const double t = static_cast<double>(from_values ? param_steps[i] : ++param_steps[i]);
    AdamWTensor a;
    a.param = &p;
    a.grad = &grads[i];
    a.init = !m[i].defined();
    if (a.init) {  // the kernel's first step does not read them
      m[i] = Tensor::empty(p.shape(), p.dtype(), p.device());
      v[i] = Tensor::empty(p.shape(), p.dtype(), p.device());
    }
    check_state_slot(params_[i].name, "exp_avg", m[i], p);
    check_state_slot(params_[i].name, "exp_avg_sq", v[i], p);
    a.exp_avg = &m[i];
    a.exp_avg_sq = &v[i];
    a.decays = decays(p);
    a.decay = a.decays ? 1.0 - lr * weight_decay_ : 1.0;
    a.step_size = lr / (1.0 - std::pow(options_.beta1, t));
    a.inv_bias2 = 1.0 / (1.0 - std::pow(options_.beta2, t));
    groups[fusion_key(p)].push_back(a);
  }
  const AdamWArgs args{options_.beta1, options_.beta2, options_.eps, from_values ? &values_ : nullptr};
  for (const auto& [key, tensors] : groups) {
    const Device device = tensors.front().param->device();
    RT_KERNEL(device, "adamw", adamw_multi_tensor)(tensors, args);
    detail::after_op(device, "adamw");
  }
  m_ = std::move(m);
  v_ = std::move(v);
  if (from_values) return;  // stage() counted the steps
  param_steps_ = std::move(param_steps);
  ++steps_;
}

State AdamW::state() const {
  State out;
  out.emplace_back("step", Tensor::scalar(static_cast<double>(steps_), DType::I64));
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!m_[i].defined()) continue;
    out.emplace_back(params_[i].name + ".exp_avg", m_[i]);
    out.emplace_back(params_[i].name + ".exp_avg_sq", v_[i]);
    out.emplace_back(params_[i].name + ".step", Tensor::scalar(static_cast<double>(param_steps_[i]), DType::I64));
  }
  return out;
}

void AdamW::load_state(const State& state) {
  auto index = index_state(state);
  const int64_t steps = read_step(index);
  std::vector<Tensor> m(params_.size()), v(params_.size());
  std::vector<int64_t> param_steps(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].name;
    restore_slot(index, name + ".exp_avg", params_[i].tensor, m[i]);
    restore_slot(index, name + ".exp_avg_sq", params_[i].tensor, v[i]);
    if (m[i].defined() != v[i].defined())
      RT_THROW("optimizer state: parameter '", name, "' has only one of exp_avg / exp_avg_sq");
    if (m[i].defined()) {
      auto it = index.find(name + ".step");
      if (it == index.end()) RT_THROW("optimizer state: missing entry '", name, ".step'");
      param_steps[i] = static_cast<int64_t>(it->second.item());
    }
  }
  steps_ = steps;
  m_ = std::move(m);
  v_ = std::move(v);
  param_steps_ = std::move(param_steps);
}

// ---------------------------------------------------------------------------------------------------
// Schedules

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  RT_CHECK(o.base_lr > 0, "learning rate must be > 0, got ", o.base_lr);
  RT_CHECK(o.warmup_steps >= 0, "warmup steps must be >= 0, got ", o.warmup_steps);
  RT_CHECK(o.shape != LrShape::Step || o.step_size > 0, "step schedule needs a positive step size, got ", o.step_size);
  RT_CHECK(o.shape != LrShape::Cosine || o.total_steps > o.warmup_steps, "cosine schedule needs total steps (",
           o.total_steps, ") > warmup steps (", o.warmup_steps, ")");
  RT_CHECK(std::is_sorted(o.milestones.begin(), o.milestones.end()), "multistep milestones must be increasing");
}

double LrSchedule::at(int64_t step) const {
  const auto& o = options_;
  RT_CHECK(step >= 0, "learning-rate schedule: negative step ", step);
  if (step < o.warmup_steps) {
    const double f = o.warmup_start_factor +
                     (1.0 - o.warmup_start_factor) * static_cast<double>(step) / static_cast<double>(o.warmup_steps);
    return o.base_lr * f;
  }
  const int64_t s = step - o.warmup_steps;
  switch (o.shape) {
    case LrShape::Constant:
      return o.base_lr;
    case LrShape::Step:
      return o.base_lr * std::pow(o.gamma, static_cast<double>(s / o.step_size));
    case LrShape::MultiStep: {
      const auto passed = std::upper_bound(o.milestones.begin(), o.milestones.end(), step) - o.milestones.begin();
      return o.base_lr * std::pow(o.gamma, static_cast<double>(passed));
    }
    case LrShape::Cosine: {
      const double span = static_cast<double>(o.total_steps - o.warmup_steps);
      const double progress = std::min(1.0, static_cast<double>(s) / span);
      return o.min_lr + (o.base_lr - o.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return o.base_lr;
}

}  // namespace ringtrain
