// runtime/pipeline/pipeline_plan.h: the decisions of pipeline parallelism, as pure functions (no MPI, no model):
// where a rank sits (stage x replica), how a model's blocks are split into stages (given, or balanced on
// measured costs), and in which order a stage runs the forwards and backwards of one optimizer step's
// micro-batches (1F1B or GPipe), with what that order keeps alive and the bubble it leaves.
//
// Ranks are stage-major: rank = stage x replicas + replica. So with one replica per node a stage's ranks
// share a node, and the stages of one replica lie on consecutive ranks (on consecutive nodes when nodes
// hold one stage each): p2p activations cross nodes, each stage's gradient all-reduce stays inside one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/config/options.h"

namespace ringtrain::runtime {

struct StageGrid {
  int stages = 1, replicas = 1;
  int stage = 0, replica = 0;
  // Errors name the flag: a world size that stages do not divide.
  static StageGrid of(int rank, int world_size, int stages);
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
  int rank_of(int stage_index, int replica_index) const { return stage_index * replicas + replica_index; }
};

// What one block costs, measured once on one micro-batch.
struct BlockCost {
  std::string name;
  double seconds = 0;            // forward + backward
  int64_t param_bytes = 0;       // its parameters
  int64_t activation_bytes = 0;  // what its forward keeps for the backward (its output included)
  int64_t output_bytes = 0;      // its output: what a stage starting after it receives and keeps
  int64_t backward_bytes = 0;    // what its backward needs above the activations kept (gradients, scratch)
};

// A split: stage s holds blocks [begin[s], begin[s + 1]); begin.front() == 0, begin.back() == blocks.
using PipelineSplit = std::vector<int>;

// "--pipeline-split 0,9,18": the first block of every stage. Errors name the flag: not increasing, not
// starting at 0, a stage without a block, past the last block, another count than the stages.
PipelineSplit parse_pipeline_split(const std::string& text, int blocks, int stages);
// The contiguous split that minimises the slowest stage's seconds (each stage at least one block).
PipelineSplit balance_time(const std::vector<BlockCost>& blocks, int stages);
// The one that minimises the largest stage's memory: its parameters times `state_factor` (weights,
// gradients and optimizer state: 2 + the optimizer's slots) plus its activations times what the schedule
// keeps in flight at that stage — with `recompute`, the stage's input for every micro-batch in flight plus,
// in backward, one micro-batch's block inputs and its widest block's activations — plus the most any of its
// blocks' backward needs on top.
PipelineSplit balance_memory(const std::vector<BlockCost>& blocks, int stages, PipelineSchedule schedule,
                             int micro_batches, double state_factor, bool recompute = false);
// Even: as equal block counts as can be (the baseline the balancer is compared with).
PipelineSplit even_split(int blocks, int stages);
std::string split_text(const PipelineSplit& split);  // "0,9,18"

// One entry of a stage's order of work.
struct PipelineOp {
  enum Kind : uint8_t { Forward, Backward } kind;
  int micro = 0;
  bool operator==(const PipelineOp& o) const { return kind == o.kind && micro == o.micro; }
};
// Stage `stage`'s order of the forwards and backwards of `micro_batches` micro-batches. GPipe: every
// forward, then every backward. 1F1B: stages - 1 - stage forwards to fill the pipe, then one forward and
// one backward in turn, then the backwards left. Backwards run in micro-batch order in both, so gradients
// accumulate as one process accumulates them.
std::vector<PipelineOp> pipeline_order(PipelineSchedule schedule, int stages, int stage, int micro_batches);
// The most micro-batches whose activations stage `stage` holds at once in that order.
int in_flight(PipelineSchedule schedule, int stages, int stage, int micro_batches);
// The idle share of an ideal pipeline of equal stages: (S - 1) / (M + S - 1).
double ideal_bubble(int stages, int micro_batches);

}  // namespace ringtrain::runtime
