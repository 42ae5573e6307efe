#include "core/autocast.h"

#include <limits>
#include <memory>

#include "core/autograd.h"
#include "core/check.h"

namespace ringtrain {
namespace {
thread_local std::optional<DType> t_autocast;
thread_local WeightCastScope* t_casts = nullptr;

// The gradient node of a scope's cast: the gradient back to the weight's dtype. It saves nothing, so it is
// never released (the graphs of all the scope's micro-batches share it), and it runs first among the
// nodes ready with it (its sequence is the largest), as a cast recorded next to its use would.
struct SharedCastNode final : Node {
  DType source = DType::F32;
  std::vector<Tensor> apply(Tensor grad_output) override { return {grad_output.to(source)}; }
  void release() override {}
};
}  // namespace

struct WeightCastScope::Cached {
  Tensor weight, cast;  // the weight is held so that its address names it for the scope's life
};

WeightCastScope::WeightCastScope() : previous_(t_casts) { t_casts = this; }
WeightCastScope::~WeightCastScope() { t_casts = previous_; }

Tensor autocast_cast(const Tensor& x, DType dtype) {
  WeightCastScope* scope = t_casts;
  if (!scope || !x.defined() || x.dtype() == dtype || !x.requires_grad() || x.grad_fn()) return x.to(dtype);
  for (const WeightCastScope::Cached& c : scope->cached_)
    if (c.weight.impl() == x.impl() && c.cast.dtype() == dtype) {
      ++scope->reuses_;
      return c.cast;
    }
  // Recorded even under no_grad (a recomputed block's first forward): its recomputation under grad
  // then finds the cast with its node.
  Tensor cast = x.detach().to(dtype);
  auto node = std::make_shared<SharedCastNode>();
  node->source = x.dtype();
  node->sequence = std::numeric_limits<uint64_t>::max();
  cast = record_node("to_dtype", {&x}, cast, std::move(node));
  scope->cached_.push_back({x, cast});
  ++scope->casts_;
  return cast;
}

AutocastGuard::AutocastGuard(std::optional<DType> dtype) : previous_(t_autocast) {
  RT_CHECK(!dtype || *dtype == DType::BF16 || *dtype == DType::F16,
           "AutocastGuard: autocast dtype must be bf16 or f16, got ", dtype_name(*dtype));
  t_autocast = dtype;
}

AutocastGuard::~AutocastGuard() { t_autocast = previous_; }

std::optional<DType> autocast_dtype() { return t_autocast; }

}  // namespace ringtrain
