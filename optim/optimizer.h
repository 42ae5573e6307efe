// optim/optimizer.h: SGD (momentum, Nesterov, weight decay) and AdamW with PyTorch's update rules,
// learning-rate schedules (linear warmup, then constant, step, multistep or cosine); gradient clipping by
// global norm is optim/clip.h's. Optimizer state (momentum buffers, Adam moments) lives beside each parameter
// and is exposed by name for checkpoints.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "optim/clip.h"  // clip_grad_norm, with the optimizers since they are used together

namespace ringtrain {

// Which parameters weight decay applies to. ExceptBiasAndNorm skips 1-D parameters (biases and
// batch-norm scales/shifts), the usual choice for ResNets.
enum class DecayPolicy : uint8_t { All, ExceptBiasAndNorm };

struct NamedParameter {
  std::string name;
  Tensor tensor;
};

// Fused optimizer kernels (core/kernels.h) take tensors of one device and one dtype: the key a
// parameter's work is grouped under, one kernel call per group.
using FusionKey = std::pair<std::string, int>;
FusionKey fusion_key(const Tensor& t);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update with learning rate `lr` to every parameter that has a gradient.
  virtual void step(double lr) = 0;
  // A step in two halves, for a step captured once as a CUDA graph and replayed (core/device.h CudaGraph):
  // stage(lr) does the host's part of step(lr) (the step counts) and writes the figures that change from
  // step to step (the rate; AdamW's bias corrections) into a small F64 tensor on the parameters' device,
  // with fills ordered on the stream; apply() launches the update, which reads them there when it runs, so
  // launches captured once serve every later step. stage(lr) then apply() gives step(lr)'s bits.
  // replayable(): "" when apply() may be captured now, else why not (a parameter without its state yet:
  // its first update initialises it; parameters on several devices; AdamW's per-parameter step counts
  // that differ). The default: not supported by this optimizer.
  virtual std::string replayable() const;
  virtual void stage(double lr);
  virtual void apply();
  void zero_grad(bool set_to_none = true);
  // State tensors by "<parameter name>.<slot>" (e.g. "fc.weight.momentum"), plus "step".
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  // Restores state() output; errors name missing or mismatched entries, and a failed load changes nothing.
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state) = 0;
  int64_t steps() const { return steps_; }
  // Bytes of state the optimizer holds once every parameter has taken a step (momentum buffers, moments;
  // the state is made at a parameter's first step): what a run's plan reports before training.
  virtual int64_t state_bytes() const = 0;

 protected:
  explicit Optimizer(std::vector<NamedParameter> params, double weight_decay, DecayPolicy policy);
  bool decays(const Tensor& p) const;
  // stage(): `values` into values_ (made on the parameters' device at first use), one fill each.
  void write_values(const std::vector<double>& values);
  // replayable()'s checks shared by the rules: one device, and every parameter with a gradient has state.
  std::string replayable_state(const std::vector<Tensor>& state, const char* slot) const;
  // apply()'s precondition: replayable() and a stage() before it; else the error names `rule`.
  void check_staged(const char* rule) const;
  std::vector<NamedParameter> params_;
  Tensor values_;  // stage()'s figures, F64 on the parameters' device
  double weight_decay_;
  DecayPolicy policy_;
  int64_t steps_ = 0;
};

struct SgdOptions {
  double momentum = 0.9;
  double dampening = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;  // L2, added to the gradient (PyTorch SGD)
  DecayPolicy decay_policy = DecayPolicy::All;
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<NamedParameter> params, SgdOptions options);
  void step(double lr) override;
  std::string replayable() const override;
  void stage(double lr) override;
  void apply() override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state) override;
  int64_t state_bytes() const override;

 private:
  // The update's launches: by value at `lr`, or reading values_ (apply()).
  void launch(double lr, bool from_values);
  SgdOptions options_;
  std::vector<Tensor> momentum_;  // undefined until the parameter's first step
};

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: p -= lr * wd * p
  DecayPolicy decay_policy = DecayPolicy::All;
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<NamedParameter> params, AdamWOptions options);
  void step(double lr) override;
  std::string replayable() const override;
  void stage(double lr) override;
  void apply() override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state) override;
  int64_t state_bytes() const override;

 private:
  // The update's launches (step's, advancing the step counts), or apply()'s reading values_.
  void launch(double lr, bool from_values);
  AdamWOptions options_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> param_steps_;  // per parameter, as PyTorch: bias correction counts its own updates
};

enum class LrShape : uint8_t { Constant, Step, MultiStep, Cosine };

struct LrScheduleOptions {
  double base_lr = 0.1;
  int64_t total_steps = 0;   // optimizer steps in the whole run (cosine needs it)
  int64_t warmup_steps = 0;  // linear from warmup_start_factor * base_lr to base_lr
  double warmup_start_factor = 0.0;
  LrShape shape = LrShape::Constant;
  int64_t step_size = 0;              // Step: decay every step_size steps (after warmup)
  std::vector<int64_t> milestones{};  // MultiStep: absolute steps where the rate is multiplied by gamma
  double gamma = 0.1;
  double min_lr = 0.0;  // Cosine: final rate
};

class LrSchedule {
 public:
  explicit LrSchedule(LrScheduleOptions options);
  // The rate for optimizer step `step` (0-based). Pure: resuming at any step gives the same rate.
  double at(int64_t step) const;
  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

// Module parameters as NamedParameter (convenience for Module::named_parameters()).
std::vector<NamedParameter> as_named(const std::vector<std::pair<std::string, Tensor>>& params);

}  // namespace ringtrain
