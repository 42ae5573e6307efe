// runtime/cluster/check_in.cpp: min/max agreement of (step, plan) in one all-reduce; the names only on mismatch.
#include "runtime/cluster/check_in.h"

#include <algorithm>
#include <span>

#include "comm/host_collectives.h"
#include "core/check.h"
#include "core/hash.h"

namespace ringtrain::runtime {

uint64_t bucket_plan_hash(const std::vector<comm::BucketInfo>& buckets) {
  Fnv1a h;
  for (const auto& b : buckets) h.add_word(static_cast<uint64_t>(b.numel));
  return h.value();
}

int64_t check_in_step(const comm::World& world, int64_t step, uint64_t plan, int64_t request) {
  // The plan is halved to fit a signed negation. One all-reduce (min): of each value and its negation
  // (equal everywhere iff min == -min(-v)), and of -request (the largest request).
  const int64_t mine[2] = {step, static_cast<int64_t>(plan >> 1)};
  int64_t v[5] = {mine[0], -mine[0], mine[1], -mine[1], -request};
  comm::all_reduce(world.comm(), std::span<int64_t>(v, 5), comm::HostOp::Min);
  if (v[0] == -v[1] && v[2] == -v[3]) return -v[4];
  const std::vector<int64_t> all = comm::all_gather(world.comm(), std::span<const int64_t>(mine, 2));
  std::string bad;
  for (int r = 1; r < world.size(); ++r)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      bad += detail::str_cat(bad.empty() ? "" : ", ", "rank ", r, " at step ", all[2 * r],
                             all[2 * r + 1] != all[1] ? " with a different bucket plan" : "");
  throw comm::CollectiveError(detail::str_cat("ranks are out of step: rank 0 is at step ", all[0], ", ", bad));
}

std::string flag_of(const std::string& key) {
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

void check_same_config(const comm::World& world, const nlohmann::json& config) {
  const std::string mine = config.dump();
  const int64_t hash[1] = {static_cast<int64_t>(fnv1a(mine) >> 1)};
  if (comm::same_on_every_rank(world.comm(), hash)) return;
  const std::vector<std::string> all = comm::all_gather_strings(world.comm(), mine);
  const nlohmann::json root = nlohmann::json::parse(all[0]);
  std::string differs;
  int named = 0;
  for (int r = 1; r < world.size() && named < 4; ++r) {
    if (all[r] == all[0]) continue;
    const nlohmann::json theirs = nlohmann::json::parse(all[r]);
    const int before = named;
    for (const auto& [key, value] : root.items()) {
      const nlohmann::json other = theirs.contains(key) ? theirs[key] : nlohmann::json();
      if (other == value) continue;
      differs += detail::str_cat("\n  rank ", r, " (", world.hosts()[r], ") has ", flag_of(key), " ", other.dump(),
                                 " where rank 0 has ", value.dump());
      ++named;
      break;
    }
    if (named == before) {
      differs += detail::str_cat("\n  rank ", r, " (", world.hosts()[r], ") has another set of flags");
      ++named;
    }
  }
  throw comm::CollectiveError(
      detail::str_cat("the ranks were started with different flags (every rank must get the same):", differs), true);
}

}  // namespace ringtrain::runtime
