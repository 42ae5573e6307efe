// layers/module.h: Module, the base of every layer and model. A module owns named parameters and
// buffers and named child modules; names compose with dots exactly as torchvision's state dicts do
// (`layer1.0.conv1.weight`, `bn1.running_mean`). forward() is the one virtual entry point for
// single-input modules; train()/eval() switch the mode recursively; state dicts are checked entry by
// entry and errors name the offending entry.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ringtrain {

// Name -> tensor, in the order PyTorch's state_dict() uses: a module's own parameters, then its own
// buffers, then each child's entries in registration order.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

class Module;

// A piece of a model whose composition in order is the model's forward: block i takes block i-1's
// output. What pipeline stages split a model into (runtime/pipeline/pipeline.h). `modules` holds the block's
// parameters and buffers (a module belongs to one block).
struct Block {
  std::string name;  // "stem", "layer1.0", "head", or a Sequential's child index
  std::vector<std::shared_ptr<Module>> modules;
  std::function<Tensor(const Tensor&)> forward;
  // A block of several modules that can recompute (layers/recompute.h): switches it on or off. Empty for
  // a block that is one module (its set_recompute is the switch) or cannot.
  std::function<void(bool)> set_recompute;
};

enum class StrictLoad : uint8_t { Strict, AllowMissingAndUnexpected };

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& x) = 0;
  // forward(x), or with set_recompute(true) and gradients on, recompute(*this, x) (layers/recompute.h):
  // what containers (Sequential, so a ResNet's residual blocks) call on their children.
  Tensor operator()(const Tensor& x);
  // "Linear", "Conv2d", ... (printing and errors)
  virtual std::string type_name() const = 0;

  // Recursive views, dotted names, registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  int64_t num_parameters() const;  // elements

  StateDict state_dict() const;
  // Copies values into the existing tensors (identity kept, so optimizers and gradient buckets that
  // hold them stay valid). Errors name the entry: missing, unexpected, shape or dtype mismatch.
  void load_state_dict(const StateDict& state, StrictLoad strict = StrictLoad::Strict);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter and buffer to `device` in place (the Tensor handles stay the same).
  void to(Device device);
  void zero_grad(bool set_to_none = true);
  // Activation recompute for this module (--recompute): its forward keeps only its input, and its
  // backward runs the forward again to differentiate it. The same gradients, bit for bit, for one more
  // forward. Takes effect where the module is called through operator() (containers do).
  void set_recompute(bool on = true) { recompute_ = on; }
  bool recomputes() const { return recompute_; }
  // One line per module with its parameter count, indented by depth.
  std::string summary() const;

  // The model as a sequence of blocks whose composition is forward() (Sequential: its children; ResNet:
  // stem, each residual block, head), for pipeline stages; empty (the default): not such a sequence.
  virtual std::vector<Block> blocks() { return {}; }

  // ZeRO-1's seam (comm/grad_sync.h): a layer calls use_parameters() at the top of its forward, before it
  // reads its own parameters, and the hook set here waits for the all-gather of just those, so the
  // gather of later layers' weights goes on while earlier layers compute. Held weakly (it ends with its
  // owner); one per module; covers the module's own parameters, not its children's. A custom layer that
  // registers parameters should call use_parameters() too; one that does not is noticed (GradSync then
  // waits for the whole gather before the forward, as if there were no hooks).
  using UseHook = std::function<void(const Module&)>;
  void set_use_hook(std::weak_ptr<const UseHook> hook) const { use_hook_ = std::move(hook); }
  // This module's own parameters (not its children's), and every module of the tree, depth first.
  const std::vector<std::pair<std::string, Tensor>>& own_parameters() const { return parameters_; }
  void for_each_module(const std::function<void(const Module&)>& fn) const;

 protected:
  // For constructors. Parameters require grad and carry their dotted name once attached to a parent.
  Tensor register_parameter(std::string name, Tensor value);
  Tensor register_buffer(std::string name, Tensor value);
  // The module's dotted path from the model ("layer1.0.conv1"). Layers whose forward a parent may call
  // directly (not through operator()) open profile::LayerScope(path()) themselves, for --profile-layers.
  const std::string& path() const { return path_; }
  // Layers: before reading their own parameters in forward (see set_use_hook).
  void use_parameters() const {
    if (auto hook = use_hook_.lock()) (*hook)(*this);
  }
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> child) {
    attach_child(std::move(name), child);
    return child;
  }

 private:
  void attach_child(std::string name, std::shared_ptr<Module> child);
  void collect(const std::string& prefix, bool parameters, bool buffers,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  void rename_tensors(const std::string& prefix);
  void summarize(const std::string& name, int depth, std::string& out) const;

  std::vector<std::pair<std::string, Tensor>> parameters_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::string path_;  // the dotted path from the model ("layer1.0.conv1"): --profile's per-layer label
  bool training_ = true;
  bool recompute_ = false;
  mutable std::weak_ptr<const UseHook> use_hook_;  // instrumentation, not state: settable on a const model
};

}  // namespace ringtrain
