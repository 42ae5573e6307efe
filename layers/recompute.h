// layers/recompute.h: activation recompute (also called activation checkpointing). recompute(m, x) runs m's
// forward keeping nothing but x; the backward runs the forward again from x — with gradients on, the same
// generator position and per-sample keying (dropout and drop_path draw the same masks, core/ops.h
// sample_draws, even when another micro-batch's forward ran in between) and the same autocast — and
// backpropagates through it. So a recomputed block holds its input between forward and backward instead of
// every activation it made, for one more forward. The arithmetic is the plain run's: the gradients are the
// same bits. The second forward's batch norms take the first's batch statistics (core/ops.h BatchNormTape)
// instead of reducing their inputs again (SyncBN: exchanging them again), and the running statistics move
// once: the module buffers the second forward would change are put back.
//
//   block->set_recompute(true);   // then Sequential (and any caller of (*block)(x)) recomputes it
//   y = recompute(*block, x);    // or directly
//
// Outside gradient mode (evaluation, no_grad) it is forward(x). The module must outlive the backward.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"
#include "layers/module.h"

namespace ringtrain {

Tensor recompute(Module& module, const Tensor& x);
// The same for a block that is a function of several modules (a ResNet's stem): their parameters get the
// gradients, their buffers are put back after the recompute.
using BlockFn = std::function<Tensor(const Tensor&)>;
Tensor recompute(BlockFn fn, const Tensor& x, const std::vector<const Module*>& modules);

// --recompute: every block of model.blocks() but the last recomputed: set_recompute(true) on a block that
// is one module (a ResNet's residual blocks, a Sequential's children), the block's own set_recompute for
// one of several (a ResNet's stem). The last (a ResNet's head) stays plain: its backward follows its
// forward at once, so recomputing it would save nothing and cost a forward. Returns how many were marked;
// a block of several modules without a set_recompute is left as it is; a model that is no sequence of
// blocks is an error naming it (mark its blocks yourself). on = false switches every block off again, the
// last too (the memory plan probes a model both ways); it returns 0.
int recompute_blocks(Module& model, bool on = true);

}  // namespace ringtrain
