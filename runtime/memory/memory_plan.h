// runtime/memory/memory_plan.h: the memory model of a training run. Before the first step every rank
// measures what one micro-batch costs above the model's state (probe_activations: a forward and backward of
// one and of two random images per compute thread, at least 2 and 4, the tensor allocator's high-water mark
// above what it held before; oneDNN's workspaces are tensors too, core/cpu/conv.cpp), and the model
// adds the rest from the options: the process baseline (its resident set at fit(), which holds the weights),
// the gradient buckets, the optimizer state (1/N of it with --zero 1), the compressed gradients' wire
// buffers, and the input batches in flight. predict_peak() is a pure function of those facts and the
// options, so the remedies of a refused run (a smaller micro-batch with more accumulation, --recompute,
// --precision bf16, --zero 1, --pipeline-stages 2) are predicted by the same arithmetic, and so is -b auto.
//
//   MemoryFacts f = measure_memory_facts(o, device, model, data, step_fn);
//   MemoryPrediction p = predict_peak(o, f, world_size);   // p.total <= budget, or refuse with remedies(...)
//
// plan_memory() (runtime/memory/plan_memory.h) does that on every rank, collectively, before fit()'s run is built.
//
// On the CPU the prediction is of the peak resident set (what the summary's peak_mem_bytes measures); on
// CUDA of the caching allocator's high-water mark of tensors (the summary's peak_tensor_bytes): what has to
// fit on the device. Its reserve above that (cached blocks, never split, that a request of another size
// cannot use) is given back when a cudaMalloc fails (core/allocator.cpp), so it is not a need, and it
// depends on the order of requests, which a probe of a few images does not repeat at the run's batch.
// cuDNN's workspaces are tensors of that allocator: the algorithm search's (RINGTRAIN_CUDNN_WORKSPACE_MB,
// 1 GiB by default, at most half the free memory) is held in the first step of each shape, while its
// activations are alive, so the probe (whose shapes are new) measures it in its fixed part, as the run's
// first step will hold it. docs/MEMORY.md holds the measured accuracy.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/world.h"
#include "core/allocator.h"
#include "core/device.h"
#include "layers/module.h"
#include "runtime/cluster/watchdog.h"
#include "runtime/config/data_source.h"
#include "runtime/config/options.h"
#include "runtime/types.h"

namespace ringtrain::runtime {

// What a micro-batch of B images adds above the state while its forward and backward run.
struct ActivationCurve {
  int64_t fixed = 0;       // the batch-independent part (weight casts, plans, the loss's own tensors;
                           // on CUDA also the algorithm search's workspace)
  int64_t per_image = 0;   // each image's activations and scratch
  int64_t high_water = 0;  // probe_activations: the allocator's largest total while it ran (all tensors)
  int64_t at(int64_t batch) const { return fixed + per_image * batch; }
};

// The measured part of the model: everything the options do not say.
struct MemoryFacts {
  bool cuda = false;
  int64_t baseline = 0;           // CPU: resident set at fit() after the probe; CUDA: the tensors held then
  int64_t peak_so_far = 0;        // the high-water mark reached before fit(): the prediction is never below it
  int64_t param_bytes = 0;        // the parameters the optimizer updates (their gradients are as large)
  int64_t image_bytes = 0;        // one image of a batch and its label
  int64_t batches_in_flight = 2;  // input batches alive at once (the loader's queue and workers, the one in use)
  ActivationCurve curve;          // at the run's --precision and --recompute
};

struct MemoryPrediction {
  int64_t baseline = 0, gradients = 0, optimizer_state = 0, wire = 0, activations = 0, input = 0;
  // --recompute on the CPU: the holes its interleaved allocations leave in the heap (glibc's free blocks
  // between live ones), a fifth of the activations: where their measured spread centres (docs/MEMORY.md).
  int64_t heap_gap = 0;
  int64_t total = 0;  // the predicted peak: their sum (and never below the peak reached before)
  nlohmann::json to_json() const;
  std::string str() const;  // "3.10 GiB (baseline 310 MiB, gradients 90 MiB, ...)"
};

// The peak a rank reaches with options `o` (batch, accum, optimizer, zero, compression) and facts `f`.
MemoryPrediction predict_peak(const TrainerOptions& o, const MemoryFacts& f, int world_size);
// Whether a predicted peak fits a budget: with 5% to spare, the prediction's measured accuracy
// (docs/MEMORY.md), so that what is accepted runs under the budget.
bool fits(int64_t predicted, int64_t budget);

// The activation curve of `model` on `device` (moved there already) under `o`'s precision and the
// model's recompute marks, for images of `info`'s shape: forward (step_fn's, called twice on batches of
// random images with a fixed seed, or cross-entropy) and backward at two batch sizes into preallocated
// gradients. The model is left as it was, also when the probe throws (layers/model_state.h): its gradients,
// BatchNorm statistics and the generator's stream; on CUDA the allocator's cache is given back after it (a
// bigger batch cannot use the probe's blocks).
ActivationCurve probe_activations(const TrainerOptions& o, Device device, Module& model, const DataInfo& info,
                                  const StepFn& step_fn);

// How the probe reads the allocator of its device (a fake one in the tests).
struct ProbeMeter {
  std::function<AllocatorStats()> stats;
  std::function<void()> reset_peak;
  // A caching allocator's (CUDA's): its cached blocks given back before each pass, so that a pass is measured
  // from an empty cache, whatever ran before it. Empty on the CPU, whose heap keeps its pages (baseline).
  std::function<void()> release_cache;
};
// The line through two passes, of `per` and of `2 * per` images: pass(images) makes that batch and returns
// the forward and backward to measure; each pass's cost is the tensors' high-water mark while it runs above
// what they held before it (never the allocator's reserve: see the top).
ActivationCurve measure_curve(int64_t per, const std::function<std::function<void()>(int64_t)>& pass,
                              const ProbeMeter& meter);

// A remedy of an over-budget run: the flags to change, their options, and what they are predicted to reach.
struct Remedy {
  std::string flags;  // "-b 16 --accum-steps 2", "--recompute"
  TrainerOptions options;
  MemoryPrediction prediction;
};
// The remedies that fit `budget` (each lever alone, then the smallest combination that fits when none
// does). `probe(options)` gives the activation curve of options that change --precision or --recompute.
std::vector<Remedy> remedies(const TrainerOptions& o, const MemoryFacts& f, int world_size, int64_t budget,
                             const std::function<ActivationCurve(const TrainerOptions&)>& probe);

// -b auto: the largest micro-batch predicted to fit `budget` (at most `max_batch`), with accum raised so
// that batch x world_size x accum is --global-batch when one is asked for. Errors (permanent): nothing fits
// (naming the prediction at batch 1), a --global-batch no batch that fits divides.
struct AutoBatch {
  int64_t batch = 0, accum = 1;
};
AutoBatch choose_batch(const TrainerOptions& o, const MemoryFacts& f, int world_size, int64_t budget,
                       int64_t max_batch);

// The resident set of this process now (/proc/self/statm), in bytes.
int64_t resident_bytes();

}  // namespace ringtrain::runtime
