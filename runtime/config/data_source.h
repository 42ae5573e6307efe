// runtime/config/data_source.h: what the Trainer reads batches from. A DataSource knows its geometry (image
// shape, classes, split sizes), serves this rank's training batches epoch by epoch from a
// DistributedSampler (so a resumed position continues exactly), and optionally a test split for exact
// evaluation. Two are provided: shard folders (data/shards.h) through the threaded Loader, and synthetic
// batches drawn on the device from (seed, epoch, batch index, rank) for benchmarks and tests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/shards.h"
#include "runtime/config/options.h"

namespace ringtrain::runtime {

struct DataInfo {
  int64_t height = 0, width = 0, channels = 0;  // of the batches served (after transforms)
  int classes = 0;
  int64_t train_size = 0, test_size = 0;  // records; test_size 0 = no test split
  int64_t chunk = 64;                     // records a sampler should keep together for I/O
  // What the training data is, for checkpoints: a resume on other data is refused ("60000 records of
  // 28x28x1, 10 classes, content 1a2b3c4d5e6f7a8b").
  std::string signature;
  // Segmentation: each image's labels are a (height, width) map of classes, pixels labelled ignore_index
  // counting for nothing (the loss's ignore index, evaluation's pixel accuracy and mean IoU skip them).
  bool segmentation = false;
  int64_t ignore_index = 255;
};

// The labels of a batch of n images from this data, all of class 0: (n), or (n, height, width) for segmentation.
// What probes train on (the memory plan's, the layout's).
Tensor probe_labels(const DataInfo& info, int64_t n, Device device);

// The options as a run on this data takes them: segmentation data sets the loss's ignore index (when unset).
TrainerOptions with_data(TrainerOptions o, const DataInfo& info);

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual const DataInfo& info() const = 0;
  // Starts an epoch of this rank's training batches from the sampler's current position.
  virtual void start_epoch(data::DistributedSampler& sampler, int64_t epoch) = 0;
  // The next batch of the epoch (nullopt at its end).
  virtual std::optional<data::Batch> next() = 0;
  // Where the next training batch would start: what checkpoints save.
  virtual data::SamplerState position() const = 0;
  // The test split's loader, or nullptr.
  virtual data::Loader* test_loader() { return nullptr; }
  // Joins any worker threads (idempotent; also done by the destructor).
  virtual void stop() {}
  // What the user should know but that does not stop the run (e.g. an empty test split skipped); the
  // Trainer prints them on rank 0 when the run starts.
  virtual std::vector<std::string> warnings() const { return {}; }
  // Whether this rank's batches need images (false: labels only, nothing read or decoded). A pipeline's
  // last stage needs labels only. Between epochs. A source that ignores it (the default) only does more work.
  virtual void set_images(bool images) { (void)images; }
  // The records decoded with libjpeg's warnings since the last call, one line per split (the Trainer prints
  // them after each epoch; with ShardSourceOptions::strict such a record is an error instead).
  virtual std::vector<std::string> take_decode_warnings() { return {}; }
  // Training batches alive at once at most (the memory plan's input term): the one in use and the next,
  // unless a source keeps a queue.
  virtual int64_t batches_in_flight() const { return 2; }
};

struct ShardSourceOptions {
  data::Transform train_transform = {};  // the test split uses the same with train = false
  // When set, chooses the training transform from the train split (e.g. by image size) instead.
  std::function<data::Transform(const data::SplitInfo& train)> choose_transform = {};
  int loader_threads = 0;         // 0: automatic
  int loader_nice = 10;           // loader threads' priority below the compute threads (data::LoaderOptions::nice)
  uint64_t seed = 0;              // augmentation draws
  Device device = Device::cpu();  // batches are delivered here
  bool strict = false;            // a record that decodes only with libjpeg warnings is an error (--strict)
};
// Opens `dir`'s train split and, when the manifest has one, its test split, validating every shard.
// The test split must fit the train split (same classes, and images of the same shape after the
// transforms); an empty test split is skipped with a warning. Errors name the flag, the folder, the file
// and the field.
std::unique_ptr<DataSource> open_shards(const std::string& dir, const ShardSourceOptions& options);

struct SyntheticOptions {
  int64_t size = 2048;  // records per epoch
  int64_t height = 32, width = 32, channels = 3;
  int classes = 10;
  uint64_t seed = 0;
  Device device = Device::cpu();
  // Per-pixel labels (N, H, W): each pixel's class from its first channel's value, in `classes` bands of
  // [-2, 2) (the tails join the outer bands) -- a map a segmentation model can learn.
  bool segmentation = false;
};
// Normal(0, 1) images drawn on the device (no host fill or copy inside a timed step) and fixed labels (or, for
// segmentation, labels from the images), both of the sampler's rank (a replica's: a pipeline's stages share its
// data), as the layout decided at fit().
std::unique_ptr<DataSource> synthetic_data(const SyntheticOptions& options);

}  // namespace ringtrain::runtime
