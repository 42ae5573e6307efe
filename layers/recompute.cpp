#include "layers/recompute.h"

#include <memory>
#include <optional>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/pack.h"
#include "layers/model_state.h"

namespace ringtrain {

namespace {

// A recomputed block's input, held from its forward to its backward: dense while anything else may
// still use it, packed (core/pack.h: the zeros as bits, lossless) once only the block holds it. The
// recompute unpacks the same bytes, so the gradients stay the plain run's bit for bit.
struct SavedInput {
  Tensor dense;
  std::optional<PackedZeros> packed;
  Tensor get() const { return packed ? unpack_zeros(*packed) : dense.detach(); }
};

// The inputs saved on this thread and not yet packed. When a block starts, the inputs of the blocks before
// it have usually been let go by their callers (a Sequential's x = block(x); a ResNet's x = layer2(x) lets
// layer2's input go once the stage has run), so those only a block holds are packed then. One still held
// elsewhere (the batch's images, a skip connection) waits: packing it would only add the packed copy.
// Each input is tried once it is the block's alone, and dropped from the list then (packed, or too dense
// to gain) or when its block's backward has run.
thread_local std::vector<std::weak_ptr<SavedInput>> pending_inputs;

void pack_pending_inputs() {
  std::erase_if(pending_inputs, [](const std::weak_ptr<SavedInput>& weak) {
    const std::shared_ptr<SavedInput> s = weak.lock();
    if (!s || !s->dense.defined()) return true;
    if (!s->dense.sole_owner()) return false;
    s->packed = pack_zeros(s->dense);  // leaves dense undefined when it packs
    return true;
  });
}

// The block's node: its backward runs the forward again from the saved input and backpropagates
// through it at once.
struct CheckpointNode final : Node {
  BlockFn fn;
  std::vector<Tensor> buffers;  // the modules' buffers, put back after the recompute
  std::shared_ptr<SavedInput> saved;
  bool x_grad = false;
  uint64_t stream = 0;  // the generator's position at the forward
  SampleDraws draws;    // and its per-sample keying (drop_path): the recompute may run under another micro-batch's
  std::optional<DType> cast;
  size_t params = 0;
  BatchNormTape stats;  // the forward's batch statistics, which the recompute takes instead of reducing again

  std::vector<Tensor> apply(Tensor grad) override {
    Tensor in = saved->get();
    // Once unpacked the packed copy is not needed again, unless the graph is kept for another backward.
    if (!backward_retains_graph()) saved = nullptr;
    if (x_grad) in.set_requires_grad(true);
    Tensor out;
    {
      // The running statistics move once (in the forward), and the generator goes on from where it is now.
      ModelStateGuard untouched(buffers);
      {
        EnableGradGuard grad_on;
        AutocastGuard autocast(cast);
        BatchNormTape::Scope replay(stats, BatchNormTape::Mode::kReplay);
        set_rng_stream(stream);
        const SampleDraws now = sample_draws();
        set_sample_draws(draws);
        try {
          out = fn(in);
        } catch (...) {
          set_sample_draws(now);
          throw;
        }
        set_sample_draws(now);
      }
      RT_CHECK(stats.replayed() == stats.size(), "recompute: the recompute ran ", stats.replayed(),
               " training-mode batch norms but the forward it repeats ran ", stats.size(),
               " (a recomputed block must run the same ops from the same input)");
    }
    // The parameters' gradients accumulate (and their ready hooks fire: the all-reduce) in this inner
    // backward; the node hands back x's only. The output's gradient is passed on, not kept: it goes as
    // soon as the block's last op has used it.
    if (out.requires_grad()) run_backward(std::move(out), std::move(grad), false);
    std::vector<Tensor> grads(1 + params);
    if (x_grad) grads[0] = in.grad();
    return grads;
  }
  void release() override {
    fn = nullptr;
    buffers.clear();
    saved = nullptr;
    stats = BatchNormTape();
    released = true;
  }
};

}  // namespace

Tensor recompute(Module& module, const Tensor& x) {
  return recompute([m = &module](const Tensor& in) { return m->forward(in); }, x, {&module});
}

Tensor recompute(BlockFn fn, const Tensor& x, const std::vector<const Module*>& modules) {
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
  pack_pending_inputs();
  const uint64_t stream = rng_stream();
  const std::optional<DType> cast = autocast_dtype();
  auto node = std::make_shared<CheckpointNode>();
  Tensor y;
  {
    NoGradGuard no_grad;
    BatchNormTape::Scope record(node->stats, BatchNormTape::Mode::kRecord);
    y = fn(x);
  }
  // A new handle on y's storage: the node must never attach to a tensor the block returned as it was
  // (an identity block would hand back x itself).
  y = y.detach();
  node->fn = std::move(fn);
  node->buffers = std::move(buffers);
  node->saved = std::make_shared<SavedInput>();
  node->saved->dense = x.detach();
  node->x_grad = x.requires_grad();
  node->stream = stream;
  node->draws = sample_draws();
  node->cast = cast;
  node->params = params.size();
  pending_inputs.push_back(node->saved);
  return record_node("recompute", inputs, y, std::move(node));
}

int recompute_blocks(Module& model, bool on) {
  const std::vector<Block> blocks = model.blocks();
  RT_CHECK(!blocks.empty(), "--recompute: the model (", model.type_name(),
           ") is no sequence of blocks (Module::blocks() is empty); call set_recompute(true) on the modules to "
           "recompute instead");
  // The last block stays plain when switching on: its backward follows its forward at once, so a recompute
  // would hold what the plain block holds (and hold its input on top) for one more forward. On ResNet-50 at
  // 128x128 its head recomputed cost 21 MiB more peak RSS (612 against 591 MiB). Switching off reaches every
  // block, the last too, so blocks a caller marked go back to plain.
  int marked = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    const bool mark = on && i + 1 < blocks.size();
    if (b.set_recompute) {
      b.set_recompute(mark);
      marked += mark;
    } else if (b.modules.size() == 1) {
      b.modules.front()->set_recompute(mark);
      marked += mark;
    }
  }
  return marked;
}

}  // namespace ringtrain
