// layers/module.cpp: registration, recursive traversal, state dicts, mode and device moves.
#include "layers/module.h"

#include <map>
#include <set>

#include "core/autograd.h"
#include "core/check.h"
#include "core/profile.h"
#include "layers/recompute.h"

namespace ringtrain {
namespace {
void check_name(const std::string& name, const char* what) {
  RT_CHECK(!name.empty() && name.find('.') == std::string::npos, what, " name '", name,
           "' must be non-empty and contain no '.'");
}
}  // namespace

Tensor Module::register_parameter(std::string name, Tensor value) {
  check_name(name, "parameter");
  RT_CHECK(value.defined(), "parameter '", name, "' of ", type_name(), " is undefined");
  for (const auto& [n, t] : parameters_)
    RT_CHECK(n != name, "parameter '", name, "' registered twice in ", type_name());
  value = value.detach();
  value.set_requires_grad(true);
  value.set_name(name);
  parameters_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(std::string name, Tensor value) {
  check_name(name, "buffer");
  RT_CHECK(value.defined(), "buffer '", name, "' of ", type_name(), " is undefined");
  for (const auto& [n, t] : buffers_) RT_CHECK(n != name, "buffer '", name, "' registered twice in ", type_name());
  value.set_name(name);
  buffers_.emplace_back(name, value);
  return value;
}

void Module::attach_child(std::string name, std::shared_ptr<Module> child) {
  check_name(name, "module");
  RT_CHECK(child != nullptr, "module '", name, "' is null");
  for (const auto& [n, c] : children_) RT_CHECK(n != name, "module '", name, "' registered twice in ", type_name());
  child->rename_tensors(name + ".");  // its descendants' paths too
  child->path_ = name;                // a parent attached later prefixes it in turn
  children_.emplace_back(std::move(name), std::move(child));
}

void Module::for_each_module(const std::function<void(const Module&)>& fn) const {
  fn(*this);
  for (auto& [n, c] : children_) c->for_each_module(fn);
}

void Module::rename_tensors(const std::string& prefix) {
  // Tensor names carry the full dotted path so errors deep in an op can name the parameter.
  for (auto& [n, t] : parameters_) t.set_name(prefix + t.name());
  for (auto& [n, t] : buffers_) t.set_name(prefix + t.name());
  path_ = prefix + path_;
  for (auto& [n, c] : children_) c->rename_tensors(prefix);
}

void Module::collect(const std::string& prefix, bool parameters, bool buffers,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  if (parameters)
    for (const auto& [n, t] : parameters_) out.emplace_back(prefix + n, t);
  if (buffers)
    for (const auto& [n, t] : buffers_) out.emplace_back(prefix + n, t);
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", parameters, buffers, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", true, false, out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", false, true, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t total = 0;
  for (auto& [n, t] : named_parameters()) total += t.numel();
  return total;
}

StateDict Module::state_dict() const {
  StateDict out;
  collect("", true, true, out);
  return out;
}

void Module::load_state_dict(const StateDict& state, StrictLoad strict) {
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) {
    if (!given.emplace(name, &t).second) RT_THROW("load_state_dict: entry '", name, "' appears twice");
  }
  std::set<std::string> used;
  std::vector<std::string> missing;
  const StateDict mine = state_dict();
  // Check everything before copying anything, so a failed load changes nothing.
  for (const auto& [name, target] : mine) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& source = *it->second;
    if (!(source.shape() == target.shape()))
      RT_THROW("load_state_dict: entry '", name, "' has shape ", source.shape(), " but the model's ", type_name(),
               " expects ", target.shape());
    if (source.dtype() != target.dtype())
      RT_THROW("load_state_dict: entry '", name, "' has dtype ", dtype_name(source.dtype()), " but the model expects ",
               dtype_name(target.dtype()));
    used.insert(name);
  }
  if (strict == StrictLoad::Strict) {
    if (!missing.empty()) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", '" : "'") + missing[i] + "'";
      RT_THROW("load_state_dict: ", missing.size(), " entr", missing.size() == 1 ? "y" : "ies",
               " missing from the state dict: ", list, missing.size() > 5 ? ", ..." : "");
    }
    for (const auto& [name, t] : state)
      if (!used.count(name)) RT_THROW("load_state_dict: unexpected entry '", name, "' (the model has no such tensor)");
  }
  NoGradGuard no_grad;
  for (const auto& [name, target] : mine) {
    auto it = given.find(name);
    if (it != given.end()) Tensor(target).copy_(*it->second);
  }
}

Tensor Module::operator()(const Tensor& x) {
  // --profile --profile-layers: the ops of this call (and the backward nodes they record) carry its path.
  profile::LayerScope layer(path_);
  return recompute_ && grad_enabled() ? recompute(*this, x) : forward(x);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::to(Device device) {
  for (auto* list : {&parameters_, &buffers_}) {
    for (auto& [n, t] : *list) {
      if (t.device() == device) continue;
      Tensor moved = t.detach().to(device);
      t.impl()->storage = moved.impl()->storage;
      t.impl()->offset_bytes = moved.impl()->offset_bytes;
      t.zero_grad();
    }
  }
  for (auto& [n, c] : children_) c->to(device);
}

void Module::zero_grad(bool set_to_none) {
  for (auto& t : parameters()) t.zero_grad(set_to_none);
}

void Module::summarize(const std::string& name, int depth, std::string& out) const {
  int64_t own = 0;
  for (const auto& [n, t] : parameters_) own += t.numel();
  out += std::string(static_cast<size_t>(depth) * 2, ' ') + (name.empty() ? "" : name + ": ") + type_name();
  if (own) out += " (" + std::to_string(own) + " parameters)";
  out += "\n";
  for (const auto& [n, c] : children_) c->summarize(n, depth + 1, out);
}

std::string Module::summary() const {
  std::string out;
  summarize("", 0, out);
  out += "total: " + std::to_string(num_parameters()) + " parameters\n";
  return out;
}

}  // namespace ringtrain
