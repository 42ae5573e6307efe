// layers/module.h: Module, the base of every layer and model. A module owns named parameters and
// buffers and named child modules; names compose with dots exactly as torchvision's state dicts do
// (`layer1.0.conv1.weight`, `bn1.running_mean`). forward() is the one virtual entry point for
// single-input modules; train()/eval() switch the mode recursively; state dicts are checked entry by
// entry and errors name the offending entry.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ringtrain {

// Name -> tensor, in the order PyTorch's state_dict() uses: a module's own parameters, then its own
// buffers, then each child's entries in registration order.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

enum class StrictLoad : uint8_t { Strict, AllowMissingAndUnexpected };

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
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
  // One line per module with its parameter count, indented by depth.
  std::string summary() const;

 protected:
  // For constructors. Parameters require grad and carry their dotted name once attached to a parent.
  Tensor register_parameter(std::string name, Tensor value);
  Tensor register_buffer(std::string name, Tensor value);
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
  bool training_ = true;
};

}  // namespace ringtrain
