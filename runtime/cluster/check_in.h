// runtime/cluster/check_in.h: the ranks' agreement checks. At startup they compare their whole configuration
// (every flag that must agree: batch, steps, seed, model, optimizer, data, cadences), so ranks launched
// with different flags fail at once, naming the rank and the first differing flag, instead of hanging at
// the first collective one of them skips or silently training different things. After each optimizer
// step they confirm, with one tiny all-reduce, that they are at the same step with the same gradient
// bucket plan. A disagreement is the same CollectiveError on every rank, naming the ranks that differ
// from rank 0.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/grad_sync.h"
#include "comm/world.h"

namespace ringtrain::runtime {

// A fingerprint of the bucket plan (element counts in launch order).
uint64_t bucket_plan_hash(const std::vector<comm::BucketInfo>& buckets);

// Collective. `request` rides along in the same all-reduce: the largest any rank passed is returned
// (rank 0's time-based checkpoint decision reaches every rank without a collective of its own).
int64_t check_in_step(const comm::World& world, int64_t step, uint64_t plan, int64_t request = 0);

// The flag a configuration key stands for: "lr_step_epochs" -> "--lr-step-epochs".
std::string flag_of(const std::string& key);

// Collective: `config` (a JSON object of flag name -> value, keys spelled as the flags without "--" and
// with '_' for '-') must be the same on every rank.
void check_same_config(const comm::World& world, const nlohmann::json& config);

}  // namespace ringtrain::runtime
