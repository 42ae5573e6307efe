// core/autograd.cpp: nodes, gradient mode and the iterative backward engine.
#include "core/autograd.h"

#include <atomic>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/check.h"
#include "core/ops.h"
#include "core/profile.h"

namespace ringtrain {
namespace {

thread_local bool t_grad_enabled = true;
thread_local bool t_retain_graph = false;
std::atomic<uint64_t> g_sequence{0};

// The sink for a leaf: accumulates into leaf.grad and fires its hooks.
struct AccumulateGrad final : Node {
  std::weak_ptr<TensorImpl> leaf;  // weak: the leaf owns (weakly) us, we must not own it
  std::vector<Tensor> apply(Tensor grad_output) override {
    std::shared_ptr<TensorImpl> impl = leaf.lock();
    if (!impl) return {};
    Tensor leaf_tensor(impl);
    auto& meta = impl->autograd;
    if (meta.grad) {
      Tensor existing(meta.grad);
      RT_CHECK(existing.shape() == grad_output.shape(), "gradient of shape ", grad_output.shape(),
               " cannot accumulate into .grad of shape ", existing.shape(), " of ", leaf_tensor.describe());
      existing.add_(grad_output);
    } else if (grad_output.sole_owner()) {
      // Handed over and shared with nothing: it becomes the gradient as it is.
      meta.grad = grad_output.detach().impl_ptr();
    } else {
      // The incoming gradient may alias a buffer an op keeps; own a private copy.
      meta.grad = grad_output.detach().clone().impl_ptr();
    }
    for (auto& hook : meta.ready_hooks) hook(leaf_tensor);
    return {};
  }
  void release() override {}  // holds nothing; shared by every graph that uses the leaf
};

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  auto& meta = leaf.impl()->autograd;
  if (auto existing = meta.grad_accumulator.lock()) return existing;
  auto node = std::make_shared<AccumulateGrad>();
  node->op = "AccumulateGrad";
  node->leaf = leaf.impl_ptr();
  node->inputs.push_back({leaf.shape(), leaf.dtype(), leaf.device()});
  meta.grad_accumulator = node;
  return node;
}

// The node that receives the gradient of `t` (its producer, or its accumulator for a leaf).
std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return nullptr;
  if (t.impl()->autograd.grad_fn) return t.impl()->autograd.grad_fn;
  return grad_accumulator(t);
}

}  // namespace

Node::Node() : sequence(g_sequence.fetch_add(1)), layer(profile::current_layer()) {}

Node::~Node() {
  // Steal uniquely owned successors so destruction of a long chain is a loop, not a recursion.
  std::vector<std::shared_ptr<Node>> pending;
  auto steal = [&pending](std::vector<std::shared_ptr<Node>>& edges) {
    for (auto& edge : edges)
      if (edge && edge.use_count() == 1) pending.push_back(std::move(edge));
    edges.clear();
  };
  steal(next);
  while (!pending.empty()) {
    std::shared_ptr<Node> node = std::move(pending.back());
    pending.pop_back();
    steal(node->next);
  }
}

std::string Node::describe() const {
  std::ostringstream os;
  os << op << "(";
  for (size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << dtype_name(inputs[i].dtype) << inputs[i].shape;
  os << ")";
  return os.str();
}

std::vector<Tensor> FunctionNode::apply(Tensor grad_output) { return backward(grad_output); }

void FunctionNode::release() {
  backward = nullptr;  // frees the saved tensors
  released = true;
}

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }
EnableGradGuard::EnableGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = previous_; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

Tensor record(const char* op, std::initializer_list<const Tensor*> inputs, Tensor output, BackwardFn fn) {
  return record(op, std::vector<const Tensor*>(inputs), std::move(output), std::move(fn));
}

Tensor record(const char* op, const std::vector<const Tensor*>& inputs, Tensor output, BackwardFn fn) {
  auto node = std::make_shared<FunctionNode>();
  node->backward = std::move(fn);
  return record_node(op, inputs, std::move(output), std::move(node));
}

bool backward_retains_graph() { return t_retain_graph; }

Tensor record_node(const char* op, const std::vector<const Tensor*>& inputs, Tensor output,
                   std::shared_ptr<Node> node) {
  node->op = op;
  for (const Tensor* t : inputs) {
    node->next.push_back(t ? gradient_edge(*t) : nullptr);
    if (t && t->defined())
      node->inputs.push_back({t->shape(), t->dtype(), t->device()});
    else
      node->inputs.push_back({Shape{}, DType::F32, Device::cpu()});
  }
  output.impl()->autograd.requires_grad = true;
  output.impl()->autograd.grad_fn = std::move(node);
  return output;
}

void run_backward(Tensor root, Tensor gradient, bool retain_graph) {
  RT_CHECK(root.defined(), "backward() called on an undefined tensor");
  if (!root.requires_grad()) {
    RT_THROW("backward() on ", root.describe(),
             " which does not require grad: no input of the ops that produced it requires grad "
             "(or it was computed under no_grad)");
  }
  Tensor seed_grad = std::move(gradient);
  if (!seed_grad.defined()) {
    if (root.numel() != 1) {
      RT_THROW("backward() without a gradient needs a scalar, but the tensor is ", root.describe(),
               root.grad_fn() ? " (output of " + root.grad_fn()->describe() + ")" : std::string(),
               "; reduce it (sum/mean) or pass a gradient of the same shape");
    }
    seed_grad = Tensor::ones(root.shape(), root.dtype(), root.device());
  } else {
    RT_CHECK(seed_grad.shape() == root.shape() && seed_grad.dtype() == root.dtype(), "backward(): gradient ",
             seed_grad.describe(), " does not match the tensor ", root.describe());
  }

  NoGradGuard no_grad;  // the backward pass itself is not recorded
  struct RetainFlag {
    bool previous;
    explicit RetainFlag(bool on) : previous(t_retain_graph) { t_retain_graph = on; }
    ~RetainFlag() { t_retain_graph = previous; }
    RetainFlag(const RetainFlag&) = delete;
    RetainFlag& operator=(const RetainFlag&) = delete;
  } retain_flag(retain_graph);
  std::shared_ptr<Node> root_node = gradient_edge(root);
  root = Tensor();  // the node holds what it needs of it

  // Pass 1: count, for every reachable node, how many edges point at it (explicit stack, no recursion).
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack{root_node.get()};
  dependencies[root_node.get()] = 0;
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (auto& edge : node->next) {
      if (!edge) continue;
      auto [it, inserted] = dependencies.try_emplace(edge.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(edge.get());
    }
  }

  // Pass 2: run nodes whose gradients are complete, latest-created first (reverse of the forward).
  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence < b->sequence;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later_first)> ready(
      later_first);
  std::unordered_map<Node*, Tensor> pending_grads;
  pending_grads[root_node.get()] = std::move(seed_grad);
  ready.push(root_node);
  std::vector<std::shared_ptr<Node>> executed;

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    Tensor grad_output = std::move(pending_grads[node.get()]);
    pending_grads.erase(node.get());
    if (node->released) {
      RT_THROW("backward through a graph that was already freed: op ", node->describe(),
               " released its saved tensors after the previous backward(); call backward(gradient, "
               "/*retain_graph=*/true) the first time to run backward twice");
    }
    // A branch no gradient flowed into (all its producers returned none) just passes nothing on.
    std::vector<Tensor> input_grads;
    if (grad_output.defined()) {
      profile::LayerScope layer(node->layer);  // the backward's ops belong to the forward's layer
      input_grads = node->apply(std::move(grad_output));
    }
    // Its saved tensors go now, not at the end of the pass: a node runs once a pass, and what the rest of
    // the backward holds is then only what it still needs (a recomputed block's input, for example).
    if (!retain_graph) node->release();
    executed.push_back(node);
    for (size_t i = 0; i < node->next.size(); ++i) {
      Node* next = node->next[i].get();
      if (!next) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        const Tensor& g = input_grads[i];
        const InputMeta& expect = node->inputs[i];
        if (!(g.shape() == expect.shape) || g.dtype() != expect.dtype) {
          RT_THROW("backward of op ", node->describe(), " produced a gradient ", g.describe(), " for input ", i,
                   ", which is ", dtype_name(expect.dtype), expect.shape);
        }
        // A second gradient for the same input is added into the first where nothing else holds the
        // first (the same arithmetic as add, one tensor less in flight).
        Tensor& slot = pending_grads[next];
        if (!slot.defined()) {
          slot = g;
        } else if (slot.sole_owner()) {
          slot.add_(g);
        } else {
          slot = add(slot, g);
        }
      }
      if (--dependencies[next] == 0) ready.push(node->next[i]);
    }
  }
  if (!retain_graph)
    for (auto& node : executed) node->release();
}

}  // namespace ringtrain
