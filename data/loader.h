// data/loader.h: the threaded batch loader. Worker threads read a batch's records (decoded images with
// pread and no lock; encoded ones through HDF5 under its lock), decode and augment them in parallel, and collate NHWC
// batches into a bounded queue of prefetched batches delivered in order. Each sample's augmentation depends only on
// (seed, epoch, sample index) — never on which thread did it. stop() (and the destructor) joins every
// thread, also mid-epoch; a worker's error is rethrown by next() with the batch and record named.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "data/sampler.h"
#include "data/shards.h"

namespace ringtrain::data {

struct Transform {
  bool train = true;         // random augmentation; false: deterministic (center) versions
  int64_t pad_crop = 0;      // random crop after zero-padding by this many pixels (CIFAR-style); 0 = off
  int64_t resized_crop = 0;  // random-resized crop to this size (scale [0.08, 1], ratio [3/4, 4/3]); 0 = off
  // The whole image resized to resize x resize (bilinear at pixel centres; a segmentation mask by its nearest
  // pixel) before the pad-crop and flip: small images a model needs larger (28x28 to ConvNeXt's 32x32). 0 = off;
  // not with resized_crop, nor on splits of varied sizes.
  int64_t resize = 0;
  bool hflip = false;        // random horizontal flip
  bool normalize = true;     // (x/255 - mean) / std with the split's mean/std; else x/255
  DType dtype = DType::F32;  // F32 or BF16
  // Encoded (JPEG) records under a random-resized crop are decoded at the smallest DCT scale (1/2, 1/4,
  // 1/8) that still leaves the crop at least resized_crop pixels on each side (false: full size), and only
  // in the rows and iMCU columns the crop needs (false: the whole image).
  bool dct_scaling = true;
  bool region_decode = true;
};

// Output geometry of a transform on a split: (H, W, C) of one sample.
std::array<int64_t, 3> transformed_shape(const SplitInfo& info, const Transform& t);

// Applies the transform to one decoded HWC uint8 image into `out` (transformed_shape elements of
// t.dtype). `stream` selects the random draws: (seed, epoch, sample index).
void apply_transform(const SplitInfo& info, const Transform& t, const uint8_t* image, uint64_t seed, int64_t epoch,
                     int64_t sample_index, void* out);

// A segmentation record's mask (H x W classes) through the same geometry as apply_transform gives its image
// (the same draws: resize by the nearest pixel, pad-crop, flip) into `out` (transformed height x width labels);
// pixels the crop takes from outside the image get info.ignore_index. No random-resized crop.
void apply_mask_transform(const SplitInfo& info, const Transform& t, const uint8_t* mask, uint64_t seed, int64_t epoch,
                          int64_t sample_index, int64_t* out);

// Decodes one encoded record (JPEG or PNG bytes) whose decoded shape must be `expected` and applies the
// transform to it. With a random-resized crop only the part of the image the crop needs is decoded, at
// the DCT scale t.dct_scaling allows; otherwise the whole image, then apply_transform. Returns libjpeg's
// first warning ("" when the record decoded clean).
std::string decode_transform(const SplitInfo& info, const Transform& t, const uint8_t* bytes, size_t size,
                             const std::array<int64_t, 3>& expected, uint64_t seed, int64_t epoch, int64_t sample_index,
                             void* out);

struct LoaderOptions {
  int threads = 0;  // 0: this rank's cores minus one, at least one
  // The flag `threads` came from, for errors ("--loader-threads"; bench_loader's "--threads").
  std::string threads_flag = "--loader-threads";
  int prefetch = 4;  // batches ready ahead of the consumer
  // Worker threads run at this much lower priority (Linux: their own nice value raised, 0..19) than the
  // thread that made the loader: when a CPU training step keeps every core busy, its compute threads win
  // them and the loader uses what they leave (waits, all-reduce, the optimizer); when the compute threads
  // idle (a GPU rank, or a step waiting for data) the loader has the cores to itself. 0: the same priority.
  int nice = 10;
  Transform transform;
  uint64_t seed = 0;
  // cuda:i: batches are collated into pinned host memory and copied on a copy stream; the stream that
  // is current when next() is called waits for the copy through an event (no host synchronisation).
  Device device = Device::cpu();
  // An encoded record that decodes only with libjpeg's warnings (corrupt data: parts of it gray or garbled)
  // is an error naming it, instead of being counted (take_decode_warnings).
  bool strict = false;
  // false: batches carry labels only (Batch::images undefined; nothing is read or decoded): what a
  // pipeline's last stage needs.
  bool images = true;
};

// Records an epoch decoded with libjpeg's warnings: how many, and the first ("<record>: <libjpeg's text>").
struct DecodeWarnings {
  int64_t records = 0;
  std::string first;
};

struct Batch {
  Tensor images;      // (B, H, W, C) NHWC, f32 or bf16, on LoaderOptions::device
  Tensor labels;      // (B) i64, on LoaderOptions::device; padding slots hold 0. Segmentation splits: (B, H, W)
                      // maps of classes, the split's ignore index for pixels outside the image and padding slots
  int64_t valid = 0;  // real samples; evaluation padding sits at the end and must be masked out
  int64_t index = 0;  // position of the batch in the epoch
};

class Loader {
 public:
  Loader(const ShardDataset& dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts an epoch over explicit per-batch index lists (index -1 = padding); first_batch is the
  // position of batches[0] in the epoch (Batch::index). Stops a running epoch.
  void start(std::vector<std::vector<int64_t>> batches, int64_t epoch, int64_t first_batch = 0);
  // Starts a training epoch: this rank's batches from `sampler`, from its current position on (a
  // restored state resumes mid-epoch; Batch::index counts from the epoch's start).
  void start_epoch(DistributedSampler& sampler, int64_t epoch);
  // What to save in a checkpoint: the epoch and the next batch the consumer has not received yet.
  SamplerState position() const;
  // Next batch in order; nullopt at the end of the epoch. Rethrows the first worker error.
  std::optional<Batch> next();
  // Joins every worker (safe mid-epoch, idempotent).
  void stop();
  int threads() const { return threads_; }
  // LoaderOptions::images, before start().
  void set_images(bool images);
  // The records decoded with warnings since the last call; starts counting again.
  DecodeWarnings take_decode_warnings();
  // The nice value the workers run at (the caller's when lowering it failed or nice is 0).
  int worker_nice() const { return worker_nice_.load(); }

 private:
  void worker();
  Batch build(int64_t t);
  Batch build_segmentation(Batch batch, const std::vector<int64_t>& real, int64_t n);
  Batch to_device(Batch host);

  // A host batch whose copy to the GPU may still be running, with the event that marks its end.
  struct InFlight {
    Event done;
    Batch host;
  };

  const ShardDataset& dataset_;
  LoaderOptions options_;
  int threads_ = 1;
  int caller_nice_ = 0;
  std::atomic<int> worker_nice_{0};
  std::vector<std::vector<int64_t>> batches_;
  int64_t epoch_ = 0;
  int64_t first_batch_ = 0;  // index in the epoch of batches_[0]
  mutable std::mutex mutex_;
  std::condition_variable produced_, consumed_;
  std::map<int64_t, Batch> ready_;
  int64_t next_to_build_ = 0, next_to_deliver_ = 0;
  bool stopping_ = false;
  bool started_ = false;  // start() was called (next() after stop() then returns nullopt)
  std::exception_ptr error_;
  DecodeWarnings warnings_;  // under mutex_
  std::vector<std::thread> workers_;
  Stream copy_stream_;
  std::vector<InFlight> in_flight_;
};

}  // namespace ringtrain::data
