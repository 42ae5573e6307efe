// data/sampler.cpp: world-size-independent epoch order, per-rank batch slicing, evaluation split.
#include "data/sampler.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "core/philox.h"

namespace ringtrain::data {
namespace {

// Fisher-Yates with a counter-based generator: step i draws from (seed, stream, i).
template <typename T>
void shuffle(std::vector<T>& v, int64_t begin, int64_t end, uint64_t seed, uint64_t stream) {
  for (int64_t i = end - 1; i > begin; --i) {
    const Philox4 r = philox4x32_10(seed, static_cast<uint64_t>(i), stream);
    const uint64_t x = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
    const int64_t j = begin + static_cast<int64_t>(x % static_cast<uint64_t>(i - begin + 1));
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(j)]);
  }
}

}  // namespace

DistributedSampler::DistributedSampler(SamplerOptions options) : options_(options) {
  const auto& o = options_;
  RT_CHECK(o.dataset_size >= 0, "sampler: negative dataset size ", o.dataset_size);
  RT_CHECK(o.world_size >= 1, "sampler: world size must be >= 1, got ", o.world_size);
  RT_CHECK(o.rank >= 0 && o.rank < o.world_size, "sampler: rank ", o.rank, " outside [0, ", o.world_size, ")");
  if (o.global_batch <= 0 || o.global_batch % o.world_size != 0)
    RT_THROW("sampler: global batch ", o.global_batch, " must be a positive multiple of the world size ", o.world_size,
             " (per-rank batch x ranks)");
  RT_CHECK(o.chunk >= 1 && o.window >= 1, "sampler: chunk (", o.chunk, ") and window (", o.window, ") must be >= 1");
}

std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  const int64_t n = options_.dataset_size;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!options_.shuffle || n == 0) return order;
  // Streams: 2*epoch for the chunk shuffle, 2*epoch+1 for the windows (distinct per epoch).
  const uint64_t seed = options_.seed;
  const int64_t chunks = (n + options_.chunk - 1) / options_.chunk;
  std::vector<int64_t> chunk_order(static_cast<size_t>(chunks));
  std::iota(chunk_order.begin(), chunk_order.end(), int64_t{0});
  shuffle(chunk_order, 0, chunks, seed, 2 * static_cast<uint64_t>(epoch));
  size_t at = 0;
  for (int64_t c : chunk_order) {
    const int64_t first = c * options_.chunk, last = std::min(n, first + options_.chunk);
    for (int64_t i = first; i < last; ++i) order[at++] = i;
  }
  for (int64_t w = 0; w < n; w += options_.window)
    shuffle(order, w, std::min(n, w + options_.window), seed, 2 * static_cast<uint64_t>(epoch) + 1);
  return order;
}

int64_t DistributedSampler::batches_per_epoch() const {
  const int64_t n = options_.dataset_size, g = options_.global_batch;
  return options_.drop_last ? n / g : (n + g - 1) / g;
}

std::vector<int64_t> DistributedSampler::rank_batch(int64_t epoch, int64_t t) const {
  std::vector<int64_t> order = epoch_order(epoch);
  RT_CHECK(t >= 0 && t < batches_per_epoch(), "sampler: batch ", t, " outside [0, ", batches_per_epoch(), ")");
  const int64_t b = per_rank_batch();
  const int64_t first = std::min<int64_t>(options_.dataset_size, t * options_.global_batch + options_.rank * b);
  const int64_t last = std::min<int64_t>(options_.dataset_size, first + b);
  return {order.begin() + first, order.begin() + last};
}

const std::vector<int64_t>& DistributedSampler::order_for(int64_t epoch) {
  if (order_epoch_ != epoch) {
    order_ = epoch_order(epoch);
    order_epoch_ = epoch;
  }
  return order_;
}

void DistributedSampler::set_epoch(int64_t epoch) {
  RT_CHECK(epoch >= 0, "sampler: negative epoch ", epoch);
  state_ = SamplerState{epoch, 0};
}

bool DistributedSampler::next(std::vector<int64_t>& indices) {
  if (state_.next_batch >= batches_per_epoch()) return false;
  const auto& order = order_for(state_.epoch);
  const int64_t b = per_rank_batch();
  const int64_t first =
      std::min<int64_t>(options_.dataset_size, state_.next_batch * options_.global_batch + options_.rank * b);
  const int64_t last = std::min<int64_t>(options_.dataset_size, first + b);
  indices.assign(order.begin() + first, order.begin() + last);
  ++state_.next_batch;
  return true;
}

void DistributedSampler::restore(const SamplerState& s) {
  RT_CHECK(s.epoch >= 0 && s.next_batch >= 0 && s.next_batch <= batches_per_epoch(), "sampler: cannot restore epoch ",
           s.epoch, " batch ", s.next_batch, " (", batches_per_epoch(), " batches per epoch)");
  state_ = s;
}

std::vector<int64_t> eval_indices(int64_t dataset_size, int rank, int world_size) {
  RT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "eval_indices: rank ", rank, " of ", world_size);
  const int64_t per_rank = (dataset_size + world_size - 1) / world_size;
  std::vector<int64_t> out(static_cast<size_t>(per_rank), -1);
  for (int64_t i = 0; i < per_rank; ++i) {
    const int64_t index = rank * per_rank + i;
    if (index < dataset_size) out[static_cast<size_t>(i)] = index;
  }
  return out;
}

std::vector<std::vector<int64_t>> eval_batches(int64_t dataset_size, int rank, int world_size, int64_t batch) {
  RT_CHECK(batch >= 1, "eval_batches: batch must be at least 1 (got ", batch, ")");
  const std::vector<int64_t> indices = eval_indices(dataset_size, rank, world_size);
  std::vector<std::vector<int64_t>> batches;
  for (size_t i = 0; i < indices.size(); i += static_cast<size_t>(batch))
    batches.emplace_back(
        indices.begin() + static_cast<std::ptrdiff_t>(i),
        indices.begin() + static_cast<std::ptrdiff_t>(std::min(indices.size(), i + static_cast<size_t>(batch))));
  return batches;
}

}  // namespace ringtrain::data
