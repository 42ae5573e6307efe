// comm/zero.h: ZeRO stage 1, the optimizer half (the gradient half is GradSync with zero_stage 1).
//
//   GradSync sync(model, comm, {.zero_stage = 1});
//   ZeroOptimizer opt(sync, [](auto pieces) { return std::make_unique<Sgd>(pieces, SgdOptions{...}); });
//   ... backward; sync.finish(); opt.step(lr);   // updates this rank's shard, then all-gathers the weights
//
// Each rank keeps the optimizer state of its shard only (1/N of it), built by `make` over this rank's
// pieces of the parameters (1-D views of the parameters' elements, their gradients views into GradSync's
// buckets; so move the model to its device before, as for GradSync).
// The arithmetic of every element is the unsharded optimizer's, so the parameters after a step are
// bitwise those of GradSync without ZeRO and the same optimizer. state() and load_state() speak the
// unsharded, canonical format ("<parameter>.<slot>" with the parameter's shape): a checkpoint written
// with ZeRO loads without it, at any world size, and the other way round.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/grad_sync.h"
#include "optim/clip.h"
#include "optim/optimizer.h"

namespace ringtrain::comm {

class ZeroOptimizer final : public Optimizer, public GradientParts {
 public:
  using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<NamedParameter> pieces)>;
  // Collective (it duplicates the communicator for the state gathers). `sync` needs zero_stage 1 and must
  // outlive this. The pieces are 1-D: give `make` DecayPolicy::All (a shape-based policy would see 1-D).
  ZeroOptimizer(GradSync& sync, const Factory& make);
  ~ZeroOptimizer() override;

  // Collective: updates this rank's pieces, then all-gathers every parameter.
  void step(double lr) override;
  // Collective: the canonical state, complete on rank 0 (the other ranks return "step" only).
  std::vector<std::pair<std::string, Tensor>> state() const override;
  // Canonical state in (every rank passes the whole of it): each rank takes its pieces' part.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state) override;

  // Bytes of optimizer state this rank holds once every piece has stepped (its shard's).
  int64_t state_bytes() const override;

  // The leaves this rank updates (1-D, one per shard piece; their gradients are this rank's shard of the
  // average after GradSync::finish()). What the loss scaler's unscale and clip_grad_norm work on, with this
  // optimizer as their GradientParts (the other ranks hold the other shards):
  //   scaler.step(zero, zero.shard_parameters(), lr, &zero);
  const std::vector<Tensor>& shard_parameters() const { return values_; }
  // GradientParts, collective over the ranks of the GradSync's communicator.
  void max(std::span<uint64_t> values) const override;
  void sum(std::span<uint64_t> values) const override;

 private:
  GradSync& sync_;
  std::vector<Tensor> values_;  // one leaf per shard piece: a view of its elements of the parameter
  std::unique_ptr<Optimizer> inner_;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace ringtrain::comm
