// Tests for data/sampler.h: world-size independence, disjointness, coverage, resumable state.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "core/check.h"
#include "data/sampler.h"

namespace ringtrain::data {
namespace {

SamplerOptions base(int64_t n, int64_t g, int rank, int world) {
  SamplerOptions o;
  o.dataset_size = n;
  o.global_batch = g;
  o.rank = rank;
  o.world_size = world;
  o.seed = 17;
  o.chunk = 8;
  o.window = 32;
  return o;
}

TEST(Sampler, EpochOrderIsAPermutationDependingOnSeedAndEpochOnly) {
  DistributedSampler s(base(1000, 24, 0, 1));
  auto order = s.epoch_order(0);
  auto sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_NE(order, s.epoch_order(1));
  for (int world : {2, 3, 4}) EXPECT_EQ(DistributedSampler(base(1000, 24, 1, world)).epoch_order(0), order);
  SamplerOptions other = base(1000, 24, 0, 1);
  other.seed = 18;
  EXPECT_NE(DistributedSampler(other).epoch_order(0), order);
  // Shuffled, but locality kept: most neighbours within the window come from few chunks.
  int identity = 0;
  for (int64_t i = 0; i < 1000; ++i) identity += order[static_cast<size_t>(i)] == i;
  EXPECT_LT(identity, 50);
}

TEST(Sampler, GlobalBatchesAreIdenticalForWorldSizes1To4) {
  const int64_t n = 997, g = 24;
  DistributedSampler single(base(n, g, 0, 1));
  EXPECT_EQ(single.batches_per_epoch(), n / g);
  for (int world : {2, 3, 4}) {
    for (int64_t t = 0; t < single.batches_per_epoch(); ++t) {
      std::vector<int64_t> global;
      for (int r = 0; r < world; ++r) {
        auto part = DistributedSampler(base(n, g, r, world)).rank_batch(2, t);
        EXPECT_EQ(static_cast<int64_t>(part.size()), g / world);
        global.insert(global.end(), part.begin(), part.end());
      }
      ASSERT_EQ(global, single.rank_batch(2, t)) << "world " << world << " batch " << t;
    }
  }
}

TEST(Sampler, RanksAreDisjointAndCoverTheDatasetWithoutDropLast) {
  const int64_t n = 100;
  for (int world : {1, 2, 3, 4}) {
    const int64_t g = 12;  // divisible by 1..4
    std::multiset<int64_t> seen;
    for (int r = 0; r < world; ++r) {
      SamplerOptions o = base(n, g, r, world);
      o.drop_last = false;
      DistributedSampler s(o);
      s.set_epoch(3);
      std::vector<int64_t> idx;
      while (s.next(idx)) seen.insert(idx.begin(), idx.end());
    }
    ASSERT_EQ(static_cast<int64_t>(seen.size()), n) << "world " << world;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen.count(i), 1u) << "world " << world << " index " << i;
  }
}

TEST(Sampler, DropLastDropsOnlyTheIncompleteGlobalBatch) {
  DistributedSampler s(base(100, 12, 0, 2));
  EXPECT_EQ(s.batches_per_epoch(), 8);
  SamplerOptions o = base(100, 12, 0, 2);
  o.drop_last = false;
  EXPECT_EQ(DistributedSampler(o).batches_per_epoch(), 9);
}

TEST(Sampler, StateSavesAndRestoresMidEpoch) {
  DistributedSampler a(base(500, 20, 1, 2));
  a.set_epoch(4);
  std::vector<int64_t> idx, rest_a;
  for (int i = 0; i < 5; ++i) a.next(idx);
  SamplerState saved = a.state();
  EXPECT_EQ(saved.epoch, 4);
  EXPECT_EQ(saved.next_batch, 5);
  while (a.next(idx)) rest_a.insert(rest_a.end(), idx.begin(), idx.end());
  DistributedSampler b(base(500, 20, 1, 2));
  b.restore(saved);
  std::vector<int64_t> rest_b;
  while (b.next(idx)) rest_b.insert(rest_b.end(), idx.begin(), idx.end());
  EXPECT_EQ(rest_a, rest_b);
  EXPECT_THROW(b.restore({4, 1000}), Error);
}

TEST(Sampler, BadConfigurationsAreClearErrors) {
  try {
    DistributedSampler(base(100, 10, 0, 3));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the world size 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DistributedSampler(base(100, 12, 4, 4)), Error);
  EXPECT_THROW(DistributedSampler(base(100, 0, 0, 1)), Error);
}

TEST(Sampler, EvaluationCoversEverySampleOnceWithMaskedPadding) {
  for (int world : {1, 2, 3, 4}) {
    std::vector<int> count(10, 0);
    size_t per_rank = 0;
    for (int r = 0; r < world; ++r) {
      auto idx = eval_indices(10, r, world);
      if (r == 0) per_rank = idx.size();
      EXPECT_EQ(idx.size(), per_rank) << "every rank runs the same number of eval steps";
      for (int64_t i : idx)
        if (i >= 0) ++count[static_cast<size_t>(i)];
    }
    for (int c : count) EXPECT_EQ(c, 1) << "world " << world;
  }
}

TEST(Sampler, EvaluationBatchesCutTheRankSlotsInOrder) {
  // 10 samples on 3 ranks: 4 slots each; batches of 3 give sizes 3 and 1, the last rank's padded.
  for (int r = 0; r < 3; ++r) {
    const auto batches = eval_batches(10, r, 3, 3);
    ASSERT_EQ(batches.size(), 2u);
    EXPECT_EQ(batches[0].size(), 3u);
    EXPECT_EQ(batches[1].size(), 1u);
    std::vector<int64_t> joined = batches[0];
    joined.push_back(batches[1][0]);
    EXPECT_EQ(joined, eval_indices(10, r, 3));
  }
  EXPECT_TRUE(eval_batches(0, 0, 1, 4).empty());
  EXPECT_THROW(eval_batches(10, 0, 1, 0), Error);
}

}  // namespace
}  // namespace ringtrain::data
