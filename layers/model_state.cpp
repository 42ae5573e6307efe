// layers/model_state.cpp: the guard's record and put-back.
#include "layers/model_state.h"

#include <exception>

#include "core/check.h"
#include "core/ops.h"

namespace ringtrain {

namespace {

std::vector<Tensor> buffers_of(const Module& model) {
  std::vector<Tensor> out;
  for (const auto& [name, b] : model.named_buffers()) out.push_back(b);
  return out;
}

}  // namespace

ModelStateGuard::ModelStateGuard(std::vector<Tensor> buffers, std::vector<Tensor>* storage)
    : buffers_(std::move(buffers)),
      copies_(storage ? storage : &own_),
      stream_(rng_stream()),
      exceptions_(std::uncaught_exceptions()) {
  std::vector<Tensor>& c = *copies_;
  if (c.size() != buffers_.size()) {
    c.clear();
    for (const Tensor& b : buffers_) c.push_back(Tensor::empty(b.shape(), b.dtype(), b.device()));
  }
  for (size_t k = 0; k < buffers_.size(); ++k) {
    RT_CHECK(c[k].shape() == buffers_[k].shape() && c[k].dtype() == buffers_[k].dtype(), "ModelStateGuard: storage ", k,
             " is ", c[k].describe(), " but its buffer is ", buffers_[k].describe());
    c[k].copy_(buffers_[k]);
  }
}

ModelStateGuard::ModelStateGuard(const Module& model, Grads grads) : ModelStateGuard(buffers_of(model)) {
  if (grads != Grads::Restore) return;
  for (const Tensor& p : model.parameters()) {
    if (!p.requires_grad()) continue;
    Grad g{p, p.grad(), Tensor()};
    if (g.held.defined()) g.copy = g.held.clone();
    grads_.push_back(std::move(g));
  }
}

void ModelStateGuard::restore() {
  for (size_t k = 0; k < buffers_.size(); ++k) Tensor(buffers_[k]).copy_((*copies_)[k]);
  set_rng_stream(stream_);
  for (Grad& g : grads_) {
    if (!g.held.defined()) {
      g.param.zero_grad(/*set_to_none=*/true);
      continue;
    }
    // The same tensor (a bucket's view stays a view), with its values as they were.
    g.held.copy_(g.copy);
    if (!g.param.grad().defined() || g.param.grad().impl() != g.held.impl()) g.param.set_grad(g.held);
  }
}

ModelStateGuard::~ModelStateGuard() noexcept(false) {
  if (std::uncaught_exceptions() > exceptions_) {
    try {
      restore();
    } catch (...) {  // the exception already unwinding says what went wrong first
    }
    return;
  }
  restore();
}

}  // namespace ringtrain
