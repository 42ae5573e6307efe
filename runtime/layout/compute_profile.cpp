// runtime/layout/compute_profile.cpp: a block's time at any micro-batch, and the profile's JSON (compute_profile.h).
#include "runtime/layout/compute_profile.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

namespace {
// The line through two measurements (at batch[0] < batch[1]), never superlinear: a slope below zero (noise)
// gives a flat line; where the line would cross zero above no images (the smaller batch faster per image
// than the larger), the larger batch's rate per image for every batch, so the smaller is never predicted
// faster per image than the larger was measured.
double line_at(const double v[2], const int64_t batch[2], int64_t b) {
  if (batch[1] == batch[0]) return v[0] * static_cast<double>(b) / static_cast<double>(std::max<int64_t>(1, batch[0]));
  const double slope = std::max(0.0, (v[1] - v[0]) / static_cast<double>(batch[1] - batch[0]));
  const double intercept = v[0] - slope * static_cast<double>(batch[0]);
  if (intercept < 0) return v[1] * static_cast<double>(b) / static_cast<double>(batch[1]);
  return intercept + slope * static_cast<double>(b);
}

// Where micro-batch b lies between the two measured batches: 0 at (or below) the first, 1 at (or above) the
// second.
double batch_weight(const ComputeProfile& c, int64_t b) {
  if (c.batch[1] == c.batch[0]) return 0;
  return std::clamp(static_cast<double>(b - c.batch[0]) / static_cast<double>(c.batch[1] - c.batch[0]), 0.0, 1.0);
}

// A block's forward or backward (`v`, at both batches) at micro-batch b. The whole model's time (every
// block's forward and backward) is the line through its sums at the two batches, which the whole passes
// set (layout_probe.h); each block takes its share of that, moving from its share at the one batch to its
// share at the other (held past them). Each block timed alone once is too noisy for a line of its own: clamped
// at zero, such a line rose above both its measurements wherever its small batch was cheap per image.
double share_at(const ComputeProfile& c, const double v[2], int64_t b) {
  double total[2] = {0, 0};
  for (const BlockProfile& x : c.blocks)
    for (int k = 0; k < 2; ++k) total[k] += x.forward[k] + x.backward[k];
  double share[2];
  for (int k = 0; k < 2; ++k) share[k] = total[k] > 0 ? v[k] / total[k] : 0;
  if (total[0] <= 0) share[0] = share[1];
  if (total[1] <= 0) share[1] = share[0];
  const double w = batch_weight(c, b);
  return ((1 - w) * share[0] + w * share[1]) * line_at(total, c.batch, b);
}
}  // namespace

double ComputeProfile::forward(size_t block, int64_t b) const { return share_at(*this, blocks.at(block).forward, b); }
double ComputeProfile::backward(size_t block, int64_t b) const { return share_at(*this, blocks.at(block).backward, b); }
double ComputeProfile::scale_at(int64_t b) const {
  const double w = batch_weight(*this, b);
  return std::max(1.0, (1 - w) * scale[0] + w * scale[1]);
}
int64_t ComputeProfile::param_bytes() const {
  int64_t s = 0;
  for (const auto& b : blocks) s += b.param_bytes;
  return s;
}

json ComputeProfile::to_json() const {
  json bl = json::array();
  for (const auto& b : blocks)
    bl.push_back({{"name", b.name},
                  {"forward_s", {b.forward[0], b.forward[1]}},
                  {"backward_s", {b.backward[0], b.backward[1]}},
                  {"param_bytes", b.param_bytes},
                  {"output_bytes_per_image", b.output_bytes_per_image},
                  {"activation_bytes_per_image", b.activation_bytes_per_image},
                  {"recomputable", b.recomputable}});
  return {{"batch", {batch[0], batch[1]}},
          {"blocks", bl},
          {"optimizer_s_per_byte", optimizer_seconds_per_byte},
          {"whole_over_blocks", {scale[0], scale[1]}},
          {"contention", contention},
          {"source", source}};
}

ComputeProfile ComputeProfile::from_json(const json& j, const std::string& where) {
  ComputeProfile p;
  try {
    const auto batch = j.at("batch").get<std::vector<int64_t>>();
    RT_CHECK(batch.size() == 2 && batch[0] >= 1 && batch[1] > batch[0], where, ": key 'batch' must be two sizes, ",
             "the second larger");
    p.batch[0] = batch[0], p.batch[1] = batch[1];
    for (const json& b : j.at("blocks")) {
      BlockProfile bp;
      bp.name = b.at("name").get<std::string>();
      const auto f = b.at("forward_s").get<std::vector<double>>(), g = b.at("backward_s").get<std::vector<double>>();
      RT_CHECK(f.size() == 2 && g.size() == 2, where, ": block ", bp.name, ": forward_s and backward_s take 2 values");
      for (int i = 0; i < 2; ++i) {
        RT_CHECK(std::isfinite(f[i]) && f[i] >= 0 && std::isfinite(g[i]) && g[i] >= 0, where, ": block ", bp.name,
                 ": a time is negative or not finite");
        bp.forward[i] = f[i], bp.backward[i] = g[i];
      }
      bp.param_bytes = b.at("param_bytes").get<int64_t>();
      bp.output_bytes_per_image = b.at("output_bytes_per_image").get<int64_t>();
      bp.activation_bytes_per_image = b.value("activation_bytes_per_image", int64_t{0});
      bp.recomputable = b.at("recomputable").get<bool>();
      p.blocks.push_back(bp);
    }
    RT_CHECK(!p.blocks.empty(), where, ": key 'blocks' is empty");
    p.optimizer_seconds_per_byte = j.at("optimizer_s_per_byte").get<double>();
    p.contention = std::max(1.0, j.value("contention", 1.0));
    if (j.contains("whole_over_blocks")) {
      const auto sc = j.at("whole_over_blocks").get<std::vector<double>>();
      RT_CHECK(sc.size() == 2 && std::isfinite(sc[0]) && sc[0] > 0 && std::isfinite(sc[1]) && sc[1] > 0, where,
               ": key 'whole_over_blocks' takes 2 positive values");
      p.scale[0] = sc[0], p.scale[1] = sc[1];
    }
    p.source = j.value("source", where);
  } catch (const json::exception& e) {
    RT_THROW(where, ": not a compute profile (", e.what(), ")");
  }
  return p;
}

}  // namespace ringtrain::runtime
