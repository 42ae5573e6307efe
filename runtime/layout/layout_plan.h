// runtime/layout/layout_plan.h: the layout planner's decisions, as pure functions (no MPI, no model): which
// layouts a global batch can be trained in on a world (data-parallel replicas x pipeline stages, the
// micro-batch and accumulation, ZeRO-1, recompute, the all-reduce backend and bucket size), what each is
// predicted to cost (peak memory per rank and step time), and which one runs.
//
//   PlanInput in{world, global_batch, options, compute, facts, ...};   // measured by layout_probe.h
//   LayoutPlan plan = plan_layouts(in);          // every layout considered, the fitting ones fastest first
//   plan.chosen().layout.apply(options);         // the run's flags
//
// The step time of a layout is built from what was measured:
//   compute   every block's forward and backward at two micro-batch sizes: the whole model's time the line
//             through their sums (never superlinear: a smaller micro-batch is never predicted faster per
//             image than the larger was measured), each block its share of it, a recomputed block's
//             forward once more (it and the backward after it in the cache: their times alone, the whole
//             pass's scale taken off);
//   pipeline  1F1B/GPipe over S stages and M micro-batches: every stage's work once (filling and draining
//             the pipe) plus M - 1 times the slowest stage's, with the activations and their gradients
//             sent between stages over the link model; its peak is the stage whose blocks' activations
//             (measured per block) times the micro-batches it holds (1F1B: S - s, GPipe: M) are largest;
//             --pipeline-recompute runs a stage's forward twice more and holds its inputs in flight, one
//             micro-batch's block inputs and its widest block with that block's gradients;
//   all-reduce  the gradient buckets (launch order, the last micro-batch's backward makes them ready) one at
//             a time through the link model, what runs past that backward is exposed; ZeRO-1 reduce-scatters
//             them, updates 1/D of the state and all-gathers the weights under the next forward (its update
//             predicted as long as plain's: the shards' copies cost what the smaller update saves);
//   optimizer the measured update time per byte of parameters;
//   sharing CPU ranks that share a host's cores run slower the more of them are busy: the probe's times
//             (all busy) are turned into a rank's alone, and each pipeline slot (fill, steady, drain) runs
//             at the speed its busy ranks leave (max(1, busy threads / cores) slower than alone).
// The link model is alpha-beta per hop, inside a host and between hosts (runtime/layout/link_model.h): measured
// at start-up (layout_probe.h), read from a calibration file, or given (ringtrain_plan --link); the compute
// profile and its line through two batches are runtime/layout/compute_profile.h.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/config/options.h"
#include "runtime/layout/compute_profile.h"
#include "runtime/layout/link_model.h"
#include "runtime/memory/memory_plan.h"
#include "runtime/pipeline/pipeline_plan.h"

namespace ringtrain::runtime {

// The world a layout runs in: hosts x ranks per host, ranks numbered host by host.
struct WorldShape {
  int hosts = 1, ranks_per_host = 1;
  bool cuda = false;
  int size() const { return hosts * ranks_per_host; }
};

enum class RecomputeChoice : uint8_t { Off, Blocks, Pipeline };
const char* name_of(RecomputeChoice r);  // "off" | "blocks" | "pipeline"

struct Layout {
  int stages = 1, replicas = 1;
  int64_t batch = 1, accum = 1;  // micro-batch per replica; accumulation (a pipeline's micro-batches)
  int zero = 0;
  RecomputeChoice recompute = RecomputeChoice::Off;
  comm::Backend backend = comm::Backend::Ring;
  double bucket_mb = 25;
  PipelineSplit split;  // stages > 1: each stage's first block (balanced on the measured time)
  // The flags that give this layout by hand: "-b 32 --accum-steps 2 --zero 1 --backend ring --bucket-mb 25".
  std::string flags() const;
  std::string short_text() const;  // "D2 x S1 b32x2 zero1 ring/25MB"
  // Sets the options this layout decides (batch, accum, global batch off, zero, recompute, pipeline, backend,
  // bucket); the others stay.
  void apply(TrainerOptions& o) const;
  nlohmann::json to_json() const;
};

struct LayoutCost {
  double compute = 0;    // the forwards and backwards of a step (a pipeline: the slowest stage's, x M)
  double bubble = 0;     // a pipeline's filling and draining, and its sends between stages
  double comm = 0;       // exposed gradient communication (beyond the backward it overlaps)
  double optimizer = 0;  // the update
  double step = 0;       // their sum: the predicted step
  int64_t peak = 0;      // predicted peak per rank
  MemoryPrediction memory;
  bool fits = true;
  double comm_share() const { return step > 0 ? comm / step : 0; }
  nlohmann::json to_json() const;
};

struct PlanInput {
  WorldShape world;
  int64_t global_batch = 0;
  TrainerOptions options;  // the run's other flags (precision, optimizer, compression, schedule, ...)
  ComputeProfile compute;
  MemoryFacts facts;                               // with recompute off
  std::optional<ActivationCurve> recompute_curve;  // with every block but the last recomputed, if the model can
  int64_t budget = 0;                              // bytes per rank (the smallest over the ranks)
  // --layout auto's own run holds this much more than a run given by hand (what the compute probe left:
  // oneDNN's primitives for its shapes): peaks are predicted as by hand, budgets checked with it added.
  int64_t probe_leftover = 0;
  std::string budget_source;
  LinkModel link;
  std::vector<comm::Backend> backends;  // the all-reduce backends to consider
  std::vector<double> bucket_mbs = {25, 5};
  int max_stages = 8;  // 1: no pipelines (a custom step function sees the whole model, which no stage holds)
  // CPU ranks share their host's cores: a rank computing while others wait (a pipeline's bubble) runs
  // faster than the probe, which had them all busy. 0: a device each (GPUs), no sharing.
  double cores_per_host = 0;  // a host's share of its machine's cores (hosts emulated on one machine share)
  int threads_per_rank = 1;
};

// The backends a world offers: ring; hierarchical when several hosts hold the same number (> 1) of ranks;
// nccl on CUDA (and not ring then: GPU tensors would cross the host).
std::vector<comm::Backend> backends_for(const WorldShape& w);

// The layouts the planner considers (see the .cpp for the rules), and in `skipped` why the others were
// not (stage counts the global batch cannot be split for, recompute where the plain layout fits, hierarchical
// where a stage's replicas would run the flat ring). Errors
// (permanent): a global batch no stage count can split over the world.
std::vector<Layout> enumerate_layouts(const PlanInput& in, std::vector<std::string>* skipped = nullptr);
LayoutCost predict_layout(const PlanInput& in, const Layout& layout);

struct PlannedLayout {
  Layout layout;
  LayoutCost cost;
  std::string why_not;  // empty for the chosen one
};
struct LayoutPlan {
  std::vector<PlannedLayout> layouts;  // the fitting ones fastest first, then the others by peak
  std::vector<std::string> skipped;
  int64_t global_batch = 0;
  const PlannedLayout& chosen() const { return layouts.front(); }
  // The table: the best `best` with their predicted step, img/s, memory and communication share, then
  // the others, a line each with why they lost.
  std::string table(size_t best = 5) const;
  nlohmann::json to_json() const;
};
// Errors (permanent): nothing fits the budget (naming the smallest predicted peak, its layout and the budget).
LayoutPlan plan_layouts(const PlanInput& in);

}  // namespace ringtrain::runtime
