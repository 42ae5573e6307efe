// runtime/layout/compute_profile.h: the planner's compute model: every block's forward and backward measured at
// two micro-batch sizes (layout_probe.h), and a block's time at any micro-batch from them. Pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ringtrain::runtime {

// One block measured at two micro-batch sizes.
struct BlockProfile {
  std::string name;
  double forward[2] = {0, 0}, backward[2] = {0, 0};  // seconds at ComputeProfile::batch[0] and [1]
  int64_t param_bytes = 0;
  int64_t output_bytes_per_image = 0;      // what a stage starting after it receives
  int64_t activation_bytes_per_image = 0;  // what its forward keeps for its backward (0: not measured)
  bool recomputable = false;               // --recompute reruns its forward in backward (all but the last)
};

struct ComputeProfile {
  int64_t batch[2] = {0, 0};
  std::vector<BlockProfile> blocks;
  double optimizer_seconds_per_byte = 0;  // the optimizer's update, per byte of parameters
  // A whole step's time over the sum of its blocks' measured one at a time, at each batch: the blocks' times
  // above are already multiplied by it (layout_probe.h); recorded to show the correction.
  double scale[2] = {1, 1};
  // That scale at micro-batch b (from the one to the other between the batches, held past them), at least
  // 1: a block whose forward runs again just before its backward (recompute) finds its activations in the
  // cache, as when timed alone, so its recomputed forward and its backward take their one-at-a-time times,
  // the scale taken off.
  double scale_at(int64_t b) const;
  // How much slower than alone the ranks ran, sharing their host's cores: max(1, busy threads / cores) over
  // the probe (every rank at once); 1 on GPUs, a device each.
  double contention = 1;
  std::string source;  // "measured on 2 ranks at 1 thread each"
  // A block's forward / backward at micro-batch b: its share of the whole model's time there, the line
  // through the blocks' sums at the two batches (never superlinear: the smaller batch is never faster per
  // image than the larger), the share moving from its measured one at the first batch to that at the second.
  double forward(size_t block, int64_t b) const;
  double backward(size_t block, int64_t b) const;
  int64_t param_bytes() const;
  nlohmann::json to_json() const;
  static ComputeProfile from_json(const nlohmann::json& j, const std::string& where);
};

}  // namespace ringtrain::runtime
