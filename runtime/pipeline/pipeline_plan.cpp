// runtime/pipeline/pipeline_plan.cpp: layout, splits (given, balanced, even) and the stages' orders of work.
#include "runtime/pipeline/pipeline_plan.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <sstream>

#include "core/check.h"
#include "core/parse.h"

namespace ringtrain::runtime {

StageGrid StageGrid::of(int rank, int world_size, int stages) {
  RT_CHECK(stages >= 1, "--pipeline-stages must be at least 1, got ", stages);
  const int below = stages * (world_size / stages), above = below + stages;
  RT_CHECK(world_size % stages == 0, "--pipeline-stages ", stages, " does not divide the ", world_size,
           " ranks: the world is stages x data-parallel replicas (run ", stages, " x D ranks, e.g. ",
           below > 0 ? detail::str_cat(below, " or ", above) : std::to_string(above), ")");
  StageGrid l;
  l.stages = stages;
  l.replicas = world_size / stages;
  l.stage = rank / l.replicas;
  l.replica = rank % l.replicas;
  return l;
}

PipelineSplit parse_pipeline_split(const std::string& text, int blocks, int stages) {
  PipelineSplit split;
  RT_CHECK(!text.empty(), "--pipeline-split: expected the first block of every stage, comma-separated (e.g. 0,9,18), ",
           "got ''");
  for (const int first : parse_number_list<int>("--pipeline-split (each stage's first block)", text, {0, 1 << 20}))
    split.push_back(first);
  RT_CHECK(static_cast<int>(split.size()) == stages, "--pipeline-split '", text, "' gives ", split.size(),
           " stage(s) but --pipeline-stages is ", stages);
  RT_CHECK(split.front() == 0, "--pipeline-split '", text, "' must start at block 0 (the first stage's first block)");
  for (size_t s = 1; s < split.size(); ++s)
    RT_CHECK(split[s] > split[s - 1], "--pipeline-split '", text, "' must be increasing: every stage needs a block");
  RT_CHECK(split.back() < blocks, "--pipeline-split '", text, "': the model has ", blocks, " blocks (0 to ", blocks - 1,
           "), so stage ", stages - 1, " would hold none");
  split.push_back(blocks);
  return split;
}

namespace {

// The contiguous split of n blocks into `stages` non-empty parts that minimises the largest stage cost,
// cost(stage, first, end) being the cost of blocks [first, end) at that stage.
PipelineSplit minimise_max(int n, int stages, const std::function<double(int, int, int)>& cost) {
  RT_CHECK(stages >= 1 && stages <= n, "the model has ", n, " blocks, too few for ", stages,
           " pipeline stages (each needs at least one)");
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[s][i]: the smallest largest cost of stages 0..s holding blocks [0, i); from[s][i]: where stage s starts.
  std::vector<std::vector<double>> best(static_cast<size_t>(stages),
                                        std::vector<double>(static_cast<size_t>(n) + 1, kInf));
  std::vector<std::vector<int>> from(static_cast<size_t>(stages), std::vector<int>(static_cast<size_t>(n) + 1, 0));
  for (int i = 1; i <= n; ++i) best[0][static_cast<size_t>(i)] = cost(0, 0, i);
  for (int s = 1; s < stages; ++s)
    for (int i = s + 1; i <= n; ++i)
      for (int j = s; j < i; ++j) {
        const double c = std::max(best[static_cast<size_t>(s - 1)][static_cast<size_t>(j)], cost(s, j, i));
        if (c < best[static_cast<size_t>(s)][static_cast<size_t>(i)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(i)] = c;
          from[static_cast<size_t>(s)][static_cast<size_t>(i)] = j;
        }
      }
  PipelineSplit split(static_cast<size_t>(stages) + 1, 0);
  split[static_cast<size_t>(stages)] = n;
  for (int s = stages - 1, end = n; s > 0; --s) {
    end = from[static_cast<size_t>(s)][static_cast<size_t>(end)];
    split[static_cast<size_t>(s)] = end;
  }
  return split;
}

}  // namespace

PipelineSplit balance_time(const std::vector<BlockCost>& blocks, int stages) {
  std::vector<double> prefix(blocks.size() + 1, 0.0);
  for (size_t i = 0; i < blocks.size(); ++i) prefix[i + 1] = prefix[i] + blocks[i].seconds;
  return minimise_max(static_cast<int>(blocks.size()), stages, [&](int, int a, int b) {
    return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)];
  });
}

PipelineSplit balance_memory(const std::vector<BlockCost>& blocks, int stages, PipelineSchedule schedule,
                             int micro_batches, double state_factor, bool recompute) {
  const size_t n = blocks.size();
  std::vector<double> params(n + 1, 0.0), acts(n + 1, 0.0), outs(n + 1, 0.0);
  // The largest backward scratch, and the largest activations, of blocks [a, b): tables, n is small.
  std::vector<std::vector<double>> peak(n + 1, std::vector<double>(n + 1, 0.0)), widest = peak;
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b <= n; ++b) {
      peak[a][b] = std::max(peak[a][b - 1], static_cast<double>(blocks[b - 1].backward_bytes));
      widest[a][b] = std::max(widest[a][b - 1], static_cast<double>(blocks[b - 1].activation_bytes));
    }
  for (size_t i = 0; i < n; ++i) {
    params[i + 1] = params[i] + static_cast<double>(blocks[i].param_bytes);
    acts[i + 1] = acts[i] + static_cast<double>(blocks[i].activation_bytes);
    outs[i + 1] = outs[i] + static_cast<double>(blocks[i].output_bytes);
  }
  return minimise_max(static_cast<int>(blocks.size()), stages, [&](int s, int a, int b) {
    const auto ua = static_cast<size_t>(a), ub = static_cast<size_t>(b);
    const auto held = static_cast<double>(in_flight(schedule, stages, s, micro_batches));
    const double input = a > 0 ? static_cast<double>(blocks[ua - 1].output_bytes) : 0.0;
    // Recomputed block by block: the inputs in flight, then in backward one micro-batch's block inputs
    // (the outputs of blocks a .. b-2) and the widest block's activations.
    const double kept =
        recompute ? held * input + (outs[ub - 1] - outs[ua]) + widest[ua][ub] : held * (acts[ub] - acts[ua]);
    return state_factor * (params[ub] - params[ua]) + kept + peak[ua][ub];
  });
}

PipelineSplit even_split(int blocks, int stages) {
  RT_CHECK(stages >= 1 && stages <= blocks, "the model has ", blocks, " blocks, too few for ", stages,
           " pipeline stages (each needs at least one)");
  PipelineSplit split;
  for (int s = 0; s <= stages; ++s) split.push_back(static_cast<int>(static_cast<int64_t>(blocks) * s / stages));
  return split;
}

std::string split_text(const PipelineSplit& split) {
  std::string out;
  for (size_t s = 0; s + 1 < split.size(); ++s) {
    if (s > 0) out += ',';
    out += std::to_string(split[s]);
  }
  return out;
}

std::vector<PipelineOp> pipeline_order(PipelineSchedule schedule, int stages, int stage, int micro_batches) {
  std::vector<PipelineOp> order;
  const int m = micro_batches;
  if (schedule == PipelineSchedule::GPipe) {
    for (int i = 0; i < m; ++i) order.push_back({PipelineOp::Forward, i});
    for (int i = 0; i < m; ++i) order.push_back({PipelineOp::Backward, i});
    return order;
  }
  const int warmup = std::min(stages - 1 - stage, m);
  for (int i = 0; i < warmup; ++i) order.push_back({PipelineOp::Forward, i});
  for (int i = 0; i + warmup < m; ++i) {
    order.push_back({PipelineOp::Forward, warmup + i});
    order.push_back({PipelineOp::Backward, i});
  }
  for (int i = std::max(0, m - warmup); i < m; ++i) order.push_back({PipelineOp::Backward, i});
  return order;
}

int in_flight(PipelineSchedule schedule, int stages, int stage, int micro_batches) {
  int held = 0, most = 0;
  for (const PipelineOp& op : pipeline_order(schedule, stages, stage, micro_batches)) {
    held += op.kind == PipelineOp::Forward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

double ideal_bubble(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace ringtrain::runtime
