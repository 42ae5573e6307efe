// runtime/pipeline/pipeline_plan.h: where a rank sits, how a model's blocks are split into stages (given, balanced on
// time or memory, even), the stages' orders of work for 1F1B and GPipe (each micro-batch forward once and
// backward once after it, backwards in micro-batch order, an order that cannot deadlock), the activations
// each order holds and the ideal bubble.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <random>

#include "runtime/pipeline/pipeline_plan.h"
#include "test_util.h"

using namespace ringtrain;
using namespace ringtrain::runtime;

namespace {

std::vector<BlockCost> costs_of(const std::vector<double>& seconds) {
  std::vector<BlockCost> out;
  for (size_t i = 0; i < seconds.size(); ++i) out.push_back({std::to_string(i), seconds[i], 0, 0});
  return out;
}

double slowest(const std::vector<BlockCost>& blocks, const PipelineSplit& split) {
  double most = 0;
  for (size_t s = 0; s + 1 < split.size(); ++s) {
    double t = 0;
    for (int b = split[s]; b < split[s + 1]; ++b) t += blocks[static_cast<size_t>(b)].seconds;
    most = std::max(most, t);
  }
  return most;
}

// Every contiguous split of n blocks into k non-empty stages.
void every_split(int n, int k, PipelineSplit& prefix, const std::function<void(const PipelineSplit&)>& fn) {
  if (static_cast<int>(prefix.size()) == k) {
    PipelineSplit s = prefix;
    s.push_back(n);
    fn(s);
    return;
  }
  const int from = prefix.back() + 1, left = k - static_cast<int>(prefix.size());
  for (int b = from; b <= n - left; ++b) {
    prefix.push_back(b);
    every_split(n, k, prefix, fn);
    prefix.pop_back();
  }
}

bool valid(const PipelineSplit& s, int blocks, int stages) {
  if (static_cast<int>(s.size()) != stages + 1 || s.front() != 0 || s.back() != blocks) return false;
  for (size_t i = 1; i < s.size(); ++i)
    if (s[i] <= s[i - 1]) return false;
  return true;
}

}  // namespace

TEST(StageGrid, RanksAreStageMajor) {
  const StageGrid a = StageGrid::of(5, 8, 2);  // 2 stages x 4 replicas
  EXPECT_EQ(a.stages, 2);
  EXPECT_EQ(a.replicas, 4);
  EXPECT_EQ(a.stage, 1);
  EXPECT_EQ(a.replica, 1);
  EXPECT_TRUE(a.last());
  EXPECT_FALSE(a.first());
  EXPECT_EQ(a.rank_of(0, 1), 1);
  EXPECT_EQ(a.rank_of(1, 3), 7);
  const StageGrid none = StageGrid::of(3, 4, 1);  // no stages: every rank a replica
  EXPECT_EQ(none.replicas, 4);
  EXPECT_EQ(none.replica, 3);
  EXPECT_TRUE(none.first() && none.last());
  const std::string e = ringtrain::testing::error_of([] { StageGrid::of(0, 6, 4); });
  EXPECT_NE(e.find("--pipeline-stages 4 does not divide the 6 ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("e.g. 4 or 8"), std::string::npos) << e;
  EXPECT_NE(ringtrain::testing::error_of([] { StageGrid::of(0, 2, 4); }).find("(run 4 x D ranks, e.g. 4)"),
            std::string::npos);
}

TEST(PipelineSplit, AGivenSplitIsCheckedNamingTheFlag) {
  EXPECT_EQ(parse_pipeline_split("0,9,18", 28, 3), (PipelineSplit{0, 9, 18, 28}));
  EXPECT_EQ(parse_pipeline_split("0", 5, 1), (PipelineSplit{0, 5}));
  auto error = [](const std::string& text, int blocks, int stages) {
    return ringtrain::testing::error_of([&] { parse_pipeline_split(text, blocks, stages); });
  };
  EXPECT_NE(error("0,9", 28, 3).find("--pipeline-split '0,9' gives 2 stage(s) but --pipeline-stages is 3"),
            std::string::npos);
  EXPECT_NE(error("1,9", 28, 2).find("must start at block 0"), std::string::npos);
  EXPECT_NE(error("0,9,9", 28, 3).find("must be increasing: every stage needs a block"), std::string::npos);
  EXPECT_NE(error("0,28", 28, 2).find("the model has 28 blocks (0 to 27), so stage 1 would hold none"),
            std::string::npos);
  for (const char* bad : {"0,x", "0,,3", "0;4", "0,4 ", "0,4294967301"})  // the last once trained as 0,5
    EXPECT_NE(error(bad, 28, 2)
                  .find("--pipeline-split (each stage's first block): a comma-separated list, each item "
                        "an integer in [0, 1048576]"),
              std::string::npos)
        << bad;
  EXPECT_NE(error("", 28, 2).find("expected the first block of every stage"), std::string::npos);
  EXPECT_EQ(split_text({0, 9, 18, 28}), "0,9,18");
}

// The balancer is the optimum: no contiguous split has a faster slowest stage (checked exhaustively).
TEST(PipelineSplit, BalancingByTimeMinimisesTheSlowestStage) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> cost(0.1, 3.0);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 2 + trial % 9, stages = 1 + trial % std::min(n, 5);
    std::vector<double> secs(static_cast<size_t>(n));
    for (double& s : secs) s = cost(gen);
    const auto blocks = costs_of(secs);
    const PipelineSplit split = balance_time(blocks, stages);
    ASSERT_TRUE(valid(split, n, stages)) << split_text(split);
    double best = std::numeric_limits<double>::infinity();
    PipelineSplit prefix{0};
    every_split(n, stages, prefix, [&](const PipelineSplit& s) { best = std::min(best, slowest(blocks, s)); });
    EXPECT_DOUBLE_EQ(slowest(blocks, split), best) << "trial " << trial << ": " << split_text(split);
  }
  // One heavy block stands alone; light ones share.
  EXPECT_EQ(balance_time(costs_of({1, 1, 1, 1, 8, 1, 1, 1}), 3), (PipelineSplit{0, 4, 5, 8}));
  EXPECT_EQ(even_split(8, 3), (PipelineSplit{0, 2, 5, 8}));
  EXPECT_NE(ringtrain::testing::error_of([] {
              balance_time(costs_of({1, 1}), 3);
            }).find("the model has 2 blocks, too few for 3 pipeline stages"),
            std::string::npos);
  EXPECT_NE(ringtrain::testing::error_of([] { even_split(2, 3); }).find("too few for 3 pipeline stages"),
            std::string::npos);
}

// Memory: parameters x the state factor plus activations x what the schedule holds at that stage. With
// 1F1B the first stage holds S micro-batches, the last one: early blocks weigh more.
TEST(PipelineSplit, BalancingByMemoryWeighsWhatEachStageHolds) {
  std::vector<BlockCost> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back({std::to_string(i), 1.0, 0, 100});
  // Equal activations: 1F1B over 2 stages holds 2 at stage 0 and 1 at stage 1, so stage 0 takes fewer.
  const PipelineSplit onef = balance_memory(blocks, 2, PipelineSchedule::OneFOneB, 8, 4);
  EXPECT_EQ(onef, (PipelineSplit{0, 2, 6}));
  // GPipe holds all 8 everywhere: an even split.
  EXPECT_EQ(balance_memory(blocks, 2, PipelineSchedule::GPipe, 8, 4), (PipelineSplit{0, 3, 6}));
  // With recompute a stage holds its input for every micro-batch in flight, and in backward one micro-batch's
  // block inputs and one block's activations. GPipe at 8 micro-batches: stage 1 holds 8 inputs, so it takes
  // one block (counting no inputs would give 0,3,6); at 2 it takes two.
  std::vector<BlockCost> outputs = blocks;
  for (BlockCost& b : outputs) b.output_bytes = 10;
  EXPECT_EQ(balance_memory(outputs, 2, PipelineSchedule::GPipe, 8, 4, true), (PipelineSplit{0, 5, 6}));
  EXPECT_EQ(balance_memory(outputs, 2, PipelineSchedule::GPipe, 2, 4, true), (PipelineSplit{0, 4, 6}));
  // A block whose backward needs much more than it keeps (its gradients' scratch) counts that once.
  std::vector<BlockCost> scratch = blocks;
  scratch[5].backward_bytes = 250;
  EXPECT_EQ(balance_memory(scratch, 2, PipelineSchedule::GPipe, 1, 4), (PipelineSplit{0, 4, 6}));
  // Parameters only (a head of large weights): it gets a stage of its own.
  std::vector<BlockCost> heavy_head(5, BlockCost{"b", 1.0, 10, 0});
  heavy_head.back().param_bytes = 1000;
  EXPECT_EQ(balance_memory(heavy_head, 2, PipelineSchedule::OneFOneB, 4, 4), (PipelineSplit{0, 4, 5}));
}

// Each micro-batch runs forward once and backward once after its forward; backwards in micro-batch order;
// 1F1B warms up with S - 1 - s forwards and then alternates.
TEST(PipelineOrder, EveryMicroBatchForwardThenBackwardInOrder) {
  for (PipelineSchedule sched : {PipelineSchedule::OneFOneB, PipelineSchedule::GPipe})
    for (int stages = 1; stages <= 5; ++stages)
      for (int m = 1; m <= 9; ++m)
        for (int s = 0; s < stages; ++s) {
          const auto order = pipeline_order(sched, stages, s, m);
          ASSERT_EQ(order.size(), static_cast<size_t>(2 * m));
          std::vector<int> forwards, backwards;
          for (const PipelineOp& op : order) {
            if (op.kind == PipelineOp::Forward) {
              forwards.push_back(op.micro);
            } else {
              EXPECT_NE(std::find(forwards.begin(), forwards.end(), op.micro), forwards.end())
                  << "backward before forward: " << name_of(sched) << " S " << stages << " s " << s << " M " << m;
              backwards.push_back(op.micro);
            }
          }
          std::vector<int> in_order(static_cast<size_t>(m));
          for (int i = 0; i < m; ++i) in_order[static_cast<size_t>(i)] = i;
          EXPECT_EQ(forwards, in_order);
          EXPECT_EQ(backwards, in_order);
        }
  using Op = PipelineOp;
  EXPECT_EQ(pipeline_order(PipelineSchedule::OneFOneB, 3, 0, 4), (std::vector<Op>{{Op::Forward, 0},
                                                                                  {Op::Forward, 1},
                                                                                  {Op::Forward, 2},
                                                                                  {Op::Backward, 0},
                                                                                  {Op::Forward, 3},
                                                                                  {Op::Backward, 1},
                                                                                  {Op::Backward, 2},
                                                                                  {Op::Backward, 3}}));
  EXPECT_EQ(pipeline_order(PipelineSchedule::OneFOneB, 3, 2, 2),
            (std::vector<Op>{{Op::Forward, 0}, {Op::Backward, 0}, {Op::Forward, 1}, {Op::Backward, 1}}));
}

TEST(PipelineOrder, OneFOneBHoldsFewerActivationsThanGPipe) {
  for (int stages = 1; stages <= 6; ++stages)
    for (int m = 1; m <= 12; ++m)
      for (int s = 0; s < stages; ++s) {
        EXPECT_EQ(in_flight(PipelineSchedule::GPipe, stages, s, m), m);
        EXPECT_EQ(in_flight(PipelineSchedule::OneFOneB, stages, s, m), std::min(stages - s, m));
      }
  EXPECT_DOUBLE_EQ(ideal_bubble(1, 4), 0.0);
  EXPECT_DOUBLE_EQ(ideal_bubble(4, 16), 3.0 / 19.0);
}

// The stages' orders run together with asynchronous sends and blocking receives (what runtime/pipeline/pipeline.cpp
// does) finish: no stage waits for a message its neighbour only sends after waiting for it.
TEST(PipelineOrder, TheStagesOrdersCannotDeadlock) {
  for (PipelineSchedule sched : {PipelineSchedule::OneFOneB, PipelineSchedule::GPipe})
    for (int stages = 1; stages <= 6; ++stages)
      for (int m = 1; m <= 10; ++m) {
        std::vector<std::vector<PipelineOp>> orders;
        for (int s = 0; s < stages; ++s) orders.push_back(pipeline_order(sched, stages, s, m));
        std::vector<size_t> at(static_cast<size_t>(stages), 0);
        // Delivered messages: activations into stage s (from s - 1), gradients into s (from s + 1).
        std::vector<std::map<int, bool>> acts(static_cast<size_t>(stages)), grads(static_cast<size_t>(stages));
        bool moved = true;
        while (moved) {
          moved = false;
          for (int s = 0; s < stages; ++s) {
            const auto us = static_cast<size_t>(s);
            if (at[us] == orders[us].size()) continue;
            const PipelineOp op = orders[us][at[us]];
            const bool forward = op.kind == PipelineOp::Forward;
            const bool needs = forward ? s > 0 : s < stages - 1;
            if (needs && !(forward ? acts : grads)[us].count(op.micro)) continue;  // blocked in a receive
            if (forward && s + 1 < stages) acts[us + 1][op.micro] = true;
            if (!forward && s > 0) grads[us - 1][op.micro] = true;
            ++at[us];
            moved = true;
          }
        }
        for (int s = 0; s < stages; ++s)
          EXPECT_EQ(at[static_cast<size_t>(s)], orders[static_cast<size_t>(s)].size())
              << name_of(sched) << " S " << stages << " M " << m << ": stage " << s << " stuck";
      }
}

TEST(PipelineNames, SchedulesAndBalancesParseNamingTheFlag) {
  EXPECT_EQ(parse_pipeline_schedule("gpipe"), PipelineSchedule::GPipe);
  EXPECT_STREQ(name_of(parse_pipeline_schedule("1f1b")), "1f1b");
  EXPECT_EQ(parse_pipeline_balance("memory"), PipelineBalance::Memory);
  EXPECT_NE(ringtrain::testing::error_of([] {
              parse_pipeline_schedule("zb");
            }).find("--pipeline-schedule: 'zb' is not one of"),
            std::string::npos);
  EXPECT_NE(
      ringtrain::testing::error_of([] { parse_pipeline_balance("x"); }).find("--pipeline-balance: 'x' is not one of"),
      std::string::npos);
}
