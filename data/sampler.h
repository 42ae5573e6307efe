// data/sampler.h: DistributedSampler. The order of samples in an epoch depends only on
// (seed, epoch, dataset size, chunk, window) — never on the world size. Global batch t is the slice
// [t*G, (t+1)*G) of that order (G = global batch) and rank r takes its contiguous part
// [t*G + r*B, t*G + (r+1)*B) with B = G / world. Changing the number of ranks at a fixed global batch
// therefore leaves every global batch unchanged (the property behind "N ranks == 1 rank" and resuming
// on another world size). For I/O locality the order is shuffled chunks of `chunk` consecutive records
// followed by a shuffle inside consecutive windows of `window` records, not single random records.
#pragma once

#include <cstdint>
#include <vector>

namespace ringtrain::data {

struct SamplerOptions {
  int64_t dataset_size = 0;
  int64_t global_batch = 0;  // G; must be divisible by the world size
  int rank = 0, world_size = 1;
  uint64_t seed = 0;
  int64_t chunk = 64;     // records kept together (use ShardDataset::chunk_records())
  int64_t window = 1024;  // shuffle window after the chunk shuffle (>= 1; 1 = none)
  bool shuffle = true;    // false: identity order (evaluation)
  bool drop_last = true;  // training drops an incomplete last global batch
};

struct SamplerState {
  int64_t epoch = 0;
  int64_t next_batch = 0;  // the next global batch this epoch
};

class DistributedSampler {
 public:
  explicit DistributedSampler(SamplerOptions options);

  // The whole epoch's order (a permutation of [0, dataset_size)), identical on every rank.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  int64_t batches_per_epoch() const;
  int64_t per_rank_batch() const { return options_.global_batch / options_.world_size; }
  // This rank's indices of global batch t of `epoch`. With drop_last=false the last batch may be short
  // (the rank's part may be empty).
  std::vector<int64_t> rank_batch(int64_t epoch, int64_t t) const;

  // Iteration with resumable state: set_epoch, then next() until it returns false.
  void set_epoch(int64_t epoch);
  bool next(std::vector<int64_t>& indices);
  SamplerState state() const { return state_; }
  void restore(const SamplerState& s);
  const SamplerOptions& options() const { return options_; }

 private:
  SamplerOptions options_;
  SamplerState state_;
  std::vector<int64_t> order_;  // cached order of state_.epoch
  int64_t order_epoch_ = -1;
  const std::vector<int64_t>& order_for(int64_t epoch);
};

// Evaluation: every sample exactly once across ranks. Rank r gets a contiguous block of
// ceil(N / world) slots; slots past the end are padding (index -1) and must be masked out of metrics.
std::vector<int64_t> eval_indices(int64_t dataset_size, int rank, int world_size);
// The same slots cut into batches of at most `batch` (for Loader::start).
std::vector<std::vector<int64_t>> eval_batches(int64_t dataset_size, int rank, int world_size, int64_t batch);

}  // namespace ringtrain::data
