// comm/grad_sync.h: GradSync, the data-parallel reducer (what DDP is to PyTorch).
//
//   GradSync sync(model, comm);          // broadcasts rank 0's weights, checks every rank has the model
//   for (...) {
//     sync.zero_grad();                  // zeroes the buckets (gradients stay views into them)
//     loss(model(x), y).backward();      // full buckets are all-reduced while backward goes on
//     sync.finish();                     // waits for the last bucket: gradients are now the average
//     opt.step(lr);
//   }
//
// Buckets are planned once, in reverse registration order (the order backward produces gradients): a
// small first bucket (first_bucket_mb) so communication starts early, then bucket_mb each. A bucket
// holds one dtype on one device; each parameter's .grad is a view into its bucket's flat buffer, so
// backward accumulates straight into the buffer the all-reduce sends. A bucket is launched the moment
// all its gradients are ready and every earlier bucket has been launched, so every rank launches the
// same buckets in the same order. CPU tensors go to the communicator's thread; GPU tensors to its stream.
//
// Errors name the parameter: one whose gradient arrives twice in a step, or never (unless allow_unused),
// and at construction a rank whose model differs from rank 0's (names, shapes, dtypes; values too when
// broadcast_parameters is off).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace ringtrain {
class Module;
}

namespace ringtrain::comm {

enum class Compression : uint8_t { None, BF16, F16 };
Compression parse_compression(const std::string& text);  // "none" | "bf16" | "fp16"

struct GradSyncOptions;
// The bytes bucket `index` (0: the first in backward order) holds before the next one begins: first_bucket_mb,
// then bucket_mb. A gradient larger than that gets a bucket of its own. The layout planner predicts a run's
// buckets with this same rule (runtime/layout/layout_plan.cpp).
int64_t bucket_capacity(const GradSyncOptions& options, size_t index);

struct GradSyncOptions {
  double first_bucket_mb = 1.0;
  double bucket_mb = 25.0;
  // Copy rank 0's parameters and buffers to every rank at construction (then verify). Off: only verify,
  // and a rank whose values differ is an error naming it and the first differing tensor.
  bool broadcast_parameters = true;
  // Parameters that get no gradient in a step contribute zeros instead of raising an error.
  bool allow_unused = false;
  // Gradients travel as bf16/f16 (halved traffic); the average is converted back to the bucket dtype.
  Compression compression = Compression::None;
  // Launch buckets during backward. Off: everything is reduced in finish() (for measuring overlap).
  bool overlap = true;
  // ZeRO stage 1: each bucket's gradients are reduce-scattered (Communicator::reduce_scatter_shard_async)
  // instead of all-reduced, so after finish() only this rank's shard of each bucket holds the average
  // (the rest of every .grad is scratch); a sharded optimizer (comm/zero.h) updates that shard and
  // gather_parameters() all-gathers the result into every parameter. The arithmetic of each element is the
  // all-reduce's, so training is bitwise the unsharded training. Not with compression.
  int zero_stage = 0;
  // ZeRO-1: overlap the parameters' all-gather with the next forward (see gather_parameters). Off: each
  // gather_parameters() waits for its gathers.
  bool overlap_gather = true;
};

// ZeRO-1: a piece of this rank's shard: elements [begin, end) of one parameter (flattened), at
// bucket_offset in its bucket.
struct ShardPiece {
  std::string name;
  int param = -1, bucket = -1;  // indices in registration order / in buckets()
  int64_t begin = 0, end = 0, bucket_offset = 0;
  Tensor grad;  // 1-D view of the bucket's gradient buffer (valid after finish())
};

struct BucketInfo {
  int64_t numel = 0, bytes = 0;
  DType dtype = DType::F32;
  Device device = Device::cpu();
  std::vector<std::string> parameters;  // in the bucket's order
};

class GradSync {
 public:
  using Named = std::vector<std::pair<std::string, Tensor>>;
  GradSync(const Module& model, CommunicatorPtr comm, GradSyncOptions options = {});
  GradSync(Named parameters, Named buffers, CommunicatorPtr comm, GradSyncOptions options = {});
  ~GradSync();  // never waits or communicates: buckets still on the wire are left to the communicator
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Waits until every bucket is reduced; gradients then hold the average over ranks. A no-op inside
  // no_sync(). Errors: a parameter that got no gradient this step (unless allow_unused).
  void finish();
  // Zeroes every bucket. Gradients stay views into the buckets (Module/Optimizer zero_grad with
  // set_to_none also works, at the price of one copy per parameter in the next backward).
  void zero_grad();
  // Forgets the step's progress (which parameters reported, which buckets launched) after a step whose
  // kernels never ran: a CUDA graph's capture that failed part way (runtime/loop/trainer.cpp). Waits for any
  // bucket launched; the buckets keep what they held.
  void discard_step();

  // While alive, backward accumulates locally and nothing is communicated (gradient accumulation):
  // k micro-batches under no_sync followed by one synchronised backward equal one k-times-larger batch.
  class NoSync {
   public:
    explicit NoSync(GradSync& owner);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    GradSync& owner_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Averages the floating buffers (BatchNorm running statistics) over ranks; integer buffers are copied
  // from rank 0. Call before evaluating or saving when BatchNorm is not synchronised.
  void average_buffers();

  // ZeRO-1 (zero_stage 1): this rank's pieces of every bucket, in bucket order; at most one per parameter.
  const std::vector<ShardPiece>& shard_pieces() const;
  // ZeRO-1, collective: after the sharded optimizer wrote `values` (one 1-D tensor per shard piece, the
  // piece's updated elements), every rank's pieces are all-gathered into every parameter. The gradient
  // buckets carry the all-gather (the gradients are spent by then): zero_grad() next, as after any step
  // (a bucket still on the wire is zeroed once its parameters are copied out).
  //
  // Built from a Module, the gathers overlap the next forward: they are launched bucket by bucket (the
  // first layers' first) and this returns at once; each layer's use_parameters() (layers/module.h) waits
  // for the buckets holding its parameters. That starts from the second step, once the first forward has
  // shown that every parameter is reached through such a hook (otherwise, and built from a list of
  // tensors, this waits for every bucket before returning). Outside a forward, call wait_parameters()
  // before reading the parameters (a state dict, a checkpoint): the Trainer does.
  void gather_parameters(const std::vector<Tensor>& values);
  // ZeRO-1: waits for every all-gather still on the wire, so the parameters hold the last step's values.
  // A no-op otherwise, and when nothing is pending.
  void wait_parameters();
  int zero_stage() const;
  // The parameters in registration order (what ShardPiece::param indexes).
  std::vector<std::pair<std::string, Tensor>> parameters() const;

  const std::vector<BucketInfo>& buckets() const;
  const Communicator& communicator() const;
  // Of the last finish(): seconds spent waiting for communication, and buckets launched before it.
  double last_wait_seconds() const;
  // ZeRO-1: whether the last gather_parameters() left its gathers to the next forward.
  bool gather_overlapped() const;
  int last_buckets_launched_early() const;
  // Of the last finish(), per bucket in launch order: when it was launched and, where the backend can
  // tell, when its all-reduce ran (otherwise begin = launch and end = the moment finish() saw it done).
  struct BucketTiming {
    int bucket = 0;
    Work::TimePoint launched, begin, end;
  };
  const std::vector<BucketTiming>& last_bucket_timings() const;

  struct State;

 private:
  GradSync(Named parameters, Named buffers, CommunicatorPtr comm, GradSyncOptions options, const Module* model);
  std::shared_ptr<State> state_;
};

// A 64-bit fingerprint of a tensor's bytes (FNV-1a over 8-byte words), e.g. to compare ranks.
uint64_t fingerprint(const Tensor& t);

}  // namespace ringtrain::comm
