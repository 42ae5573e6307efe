// layers/model_state.h: running a model without leaving a trace. A ModelStateGuard records, when it is
// made, what a forward and backward change besides their outputs: the modules' buffers (BatchNorm running
// statistics), the default generator's stream (dropout draws, core/ops.h rng_stream) and, when asked, the
// parameters' gradients. When it goes (at the end of its scope, or while an exception unwinds it) it puts
// all of them back. Probes and measurements use it (the memory plan's probe, the pipeline's block
// timings), and so do recomputes that must move the statistics once (layers/recompute.h, the pipeline's
// --pipeline-recompute).
//
//   {
//     ModelStateGuard untouched(model);   // buffers, generator and gradients
//     loss_fn(model(x), y).backward();    // measure something
//   }                                     // the model is as it was, even if that threw
//
// A failed put-back (a device error) is thrown from the destructor only when no other exception is
// already on its way: that one wins.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "layers/module.h"

namespace ringtrain {

class ModelStateGuard {
 public:
  enum class Grads : uint8_t {
    Restore,     // the parameters' gradients are put back: values into the same tensors, none stays none
    Accumulate,  // what the scope's backward adds to them stays (a recompute's gradients are the run's)
  };
  // `model`'s buffers, the generator, and the gradients as `grads` says.
  explicit ModelStateGuard(const Module& model, Grads grads = Grads::Restore);
  // These buffers (a block's) and the generator; gradients accumulate. With `storage`, the copies go into
  // its tensors (made on first use, reused after: a recompute per micro-batch allocates nothing).
  explicit ModelStateGuard(std::vector<Tensor> buffers, std::vector<Tensor>* storage = nullptr);
  ~ModelStateGuard() noexcept(false);
  ModelStateGuard(const ModelStateGuard&) = delete;
  ModelStateGuard& operator=(const ModelStateGuard&) = delete;

 private:
  void restore();
  std::vector<Tensor> buffers_;  // the live buffers
  std::vector<Tensor> own_;      // their copies, when no storage was given
  std::vector<Tensor>* copies_;  // own_ or the caller's storage
  uint64_t stream_ = 0;          // the generator's stream when the guard was made (what it puts back)
  struct Grad {
    Tensor param, held, copy;  // held: the gradient tensor at entry (undefined: none); copy: its values
  };
  std::vector<Grad> grads_;
  int exceptions_ = 0;  // std::uncaught_exceptions() at entry
};

}  // namespace ringtrain
