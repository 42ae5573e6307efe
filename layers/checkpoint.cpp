#include "layers/checkpoint.h"

#include <optional>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"

namespace ringtrain {

Tensor checkpoint(Module& module, const Tensor& x) {
  return checkpoint([m = &module](const Tensor& in) { return m->forward(in); }, x, {&module});
}

Tensor checkpoint(BlockFn fn, const Tensor& x, const std::vector<const Module*>& modules) {
  std::vector<Tensor> params, buffers;
  for (const Module* m : modules) {
    for (Tensor& p : m->parameters()) params.push_back(p);
    for (const auto& [name, b] : m->named_buffers()) buffers.push_back(b);
  }
  // The node's inputs: x and the parameters, so a block whose input needs no gradient (the first) still
  // has its parameters' gradients computed.
  std::vector<const Tensor*> inputs{&x};
  bool any = x.requires_grad();
  for (const Tensor& p : params) {
    inputs.push_back(&p);
    any = any || p.requires_grad();
  }
  if (!grad_enabled() || !any) return fn(x);
  const uint64_t stream = rng_stream();
  const std::optional<DType> cast = autocast_dtype();
  Tensor y;
  {
    NoGradGuard no_grad;
    y = fn(x);
  }
  // A new handle on y's storage: the node must never attach to a tensor the block returned as it was
  // (an identity block would hand back x itself).
  y = y.detach();
  const bool x_grad = x.requires_grad();
  return record(
      "checkpoint", inputs, y,
      [fn = std::move(fn), buffers, saved = x.detach(), x_grad, stream, cast, n = params.size()](const Tensor& grad) {
        std::vector<Tensor> kept;
        for (const Tensor& b : buffers) kept.push_back(b.clone());
        const uint64_t now = rng_stream();
        Tensor in = saved.detach();
        if (x_grad) in.set_requires_grad(true);
        Tensor out;
        {
          EnableGradGuard grad_on;
          AutocastGuard autocast(cast);
          set_rng_stream(stream);
          out = fn(in);
        }
        set_rng_stream(now);
        for (size_t k = 0; k < buffers.size(); ++k) Tensor(buffers[k]).copy_(kept[k]);
        // The parameters' gradients accumulate (and their ready hooks fire: the all-reduce) in
        // this inner backward; the node hands back x's only.
        if (out.requires_grad()) out.backward(grad);
        std::vector<Tensor> grads(1 + n);
        if (x_grad) grads[0] = in.grad();
        return grads;
      });
}

int recompute_blocks(Module& model, bool on) {
  const std::vector<Block> blocks = model.blocks();
  RT_CHECK(!blocks.empty(), "--recompute: the model (", model.type_name(),
           ") is no sequence of blocks (Module::blocks() is empty); call set_recompute(true) on the modules to "
           "recompute instead");
  int marked = 0;
  for (const Block& b : blocks) {
    if (b.set_recompute) {
      b.set_recompute(on);
      ++marked;
    } else if (b.modules.size() == 1) {
      b.modules.front()->set_recompute(on);
      ++marked;
    }
  }
  return marked;
}

}  // namespace ringtrain
