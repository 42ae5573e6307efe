// core/autograd.h: the dynamic tape. Every differentiable op records a Node whose backward closure is
// written next to the op's forward (core/ops.cpp). backward() walks the recorded graph iteratively
// (no recursion: a 100k-op chain is fine), in reverse creation order, accumulates into leaf .grad and
// fires each leaf's "gradient ready" hooks once its gradient for the pass is complete.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ringtrain {

struct InputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

struct Node {
  std::string op;                           // "mul", "matmul", ... (error messages)
  uint64_t sequence = 0;                    // creation order; later nodes run first
  std::vector<std::shared_ptr<Node>> next;  // per input: its grad_fn / AccumulateGrad, or null
  std::vector<InputMeta> inputs;            // to check the gradients backward returns
  bool released = false;                    // saved tensors freed after a backward
  const std::string* layer = nullptr;       // --profile's layer label when it was recorded (core/profile.h)

  Node();
  virtual ~Node();  // iterative: tearing down a long chain does not recurse
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients w.r.t. each input (undefined where an input needs none), given the output's gradient. The
  // engine hands the gradient over (it keeps no handle of its own), so a node that passes it on by move
  // (a recomputed block into its inner backward) lets it go as soon as it is used.
  virtual std::vector<Tensor> apply(Tensor grad_output) = 0;
  virtual void release() { released = true; }
  std::string describe() const;  // "mul(f32[2, 3], f32[3])"
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

// A node whose backward is a closure capturing what it saved (detached tensors, never the output
// Tensor itself, so no reference cycles).
struct FunctionNode final : Node {
  BackwardFn backward;
  std::vector<Tensor> apply(Tensor grad_output) override;
  void release() override;
};

// Gradient mode (thread-local). Ops record nodes only while it is on.
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Gradient mode on for a scope, also inside backward (which runs under no_grad): a node's backward that
// runs a forward again to differentiate it (layers/recompute.h).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// True when ops on these inputs must be recorded (grad mode on and some input requires grad).
bool needs_grad(std::initializer_list<const Tensor*> inputs);

// Records `fn` as the producer of `output` with the given inputs; returns output (now requiring grad).
Tensor record(const char* op, std::initializer_list<const Tensor*> inputs, Tensor output, BackwardFn fn);
Tensor record(const char* op, const std::vector<const Tensor*>& inputs, Tensor output, BackwardFn fn);
// The same with a node of the caller's own type (its op is set here; its sequence is its creation's).
Tensor record_node(const char* op, const std::vector<const Tensor*>& inputs, Tensor output, std::shared_ptr<Node> node);

// The engine entry point (Tensor::backward forwards here). `gradient` is taken over: passed by move, the
// engine holds its only handle and frees it once the root's node has used it.
// The root is taken over too: a caller that moves it in lets the engine free the root's memory as soon
// as its node has run (a recomputed block's second output).
void run_backward(Tensor root, Tensor gradient, bool retain_graph);
// True inside a backward pass that keeps the graph (retain_graph), for a node deciding whether it may
// free what it saved while it runs (the innermost pass on this thread; false outside any).
bool backward_retains_graph();

}  // namespace ringtrain
