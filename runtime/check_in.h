// runtime/check_in.h: the per-step check-in. After each optimizer step the ranks confirm, with one tiny
// all-reduce, that they are at the same step with the same gradient bucket plan; when they are not, every
// rank raises the same CollectiveError naming the ranks that differ from rank 0 (so a rank that took a
// different path is caught at once, not as a hang or as silently diverging weights).
#pragma once

#include <cstdint>

#include "comm/grad_sync.h"
#include "comm/world.h"

namespace ringtrain::runtime {

// A fingerprint of the bucket plan (element counts in launch order).
uint64_t bucket_plan_hash(const std::vector<comm::BucketInfo>& buckets);

// Collective.
void check_in_step(const comm::World& world, int64_t step, uint64_t plan);

}  // namespace ringtrain::runtime
