// runtime/config/data_source.cpp: the shard-folder and synthetic DataSources.
#include "runtime/config/data_source.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <vector>

#include "core/autograd.h"
#include "core/check.h"
#include "core/hash.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "core/tensor.h"

namespace ringtrain::runtime {
namespace {

// Files of the folder named like shards ("<split>-NNNNN-of-NNNNN.h5") that the manifest does not list: a
// half-copied dataset, or shards of another conversion. They are not read; the user is told.
std::string unlisted_shard_files(const std::string& dir) {
  std::set<std::string> listed;
  for (const auto& split : data::read_manifest(dir))
    for (const auto& shard : split.shards) listed.insert(shard.file);
  std::vector<std::string> stray;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t of = name.find("-of-");
    if (of == std::string::npos || name.size() < 4 || name.compare(name.size() - 3, 3, ".h5") != 0) continue;
    if (!listed.count(name)) stray.push_back(name);
  }
  if (stray.empty()) return "";
  std::sort(stray.begin(), stray.end());
  std::string names;
  for (size_t i = 0; i < stray.size() && i < 5; ++i) names += (i ? ", " : "") + stray[i];
  return detail::str_cat(stray.size(), " shard file(s) that manifest.json does not list are not read (", names,
                         stray.size() > 5 ? ", ..." : "", "): leftovers of another conversion?");
}

class ShardSource final : public DataSource {
 public:
  ShardSource(const std::string& dir, const ShardSourceOptions& o) {
    RT_CHECK(std::filesystem::is_directory(dir), "--data: dataset folder '", dir, "' does not exist");
    train_.emplace(data::ShardDataset::open(dir, "train"));
    const data::SplitInfo& split = train_->info();
    const data::Transform transform = o.choose_transform ? o.choose_transform(split) : o.train_transform;
    const auto shape = data::transformed_shape(split, transform);
    for (const auto& s : data::read_manifest(dir)) {
      if (s.split != "test") continue;
      if (s.records == 0) {
        warnings_.push_back(
            detail::str_cat("--data '", dir, "': the test split has no records; evaluation is skipped"));
        break;
      }
      test_.emplace(data::ShardDataset::open(dir, "test"));
      check_test_fits(dir, test_->info(), split, transform);
    }
    Fnv1a content;
    for (const auto& shard : split.shards) content.add(shard.file).add_word(shard.crc32);
    char hex[24];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(content.value()));
    info_ = {shape[0],
             shape[1],
             shape[2],
             split.num_classes,
             train_->size(),
             test_ ? test_->size() : 0,
             train_->chunk_records(),
             detail::str_cat(split.records, " records of ", split.shape_text(), ", ", split.num_classes,
                             split.segmentation ? " classes per pixel" : " classes", ", content ", hex),
             split.segmentation,
             split.ignore_index};
    if (const std::string stray = unlisted_shard_files(dir); !stray.empty())
      warnings_.push_back(detail::str_cat("--data '", dir, "': ", stray));
    data::LoaderOptions lo;
    lo.strict = o.strict;
    lo.threads = o.loader_threads;
    if (const int cores = available_cores(); o.loader_threads > cores)
      warnings_.push_back(
          detail::str_cat("--loader-threads ", o.loader_threads, " is more than the ", cores,
                          " core(s) available to this rank: threads will wait for cores (0 chooses for you)"));
    lo.nice = o.loader_nice;
    lo.seed = o.seed;
    lo.device = o.device;
    lo.transform = transform;
    train_loader_ = std::make_unique<data::Loader>(*train_, lo);
    if (test_) {
      lo.transform.train = false;
      test_loader_ = std::make_unique<data::Loader>(*test_, lo);
    }
  }
  ~ShardSource() override { ShardSource::stop(); }

  const DataInfo& info() const override { return info_; }
  void start_epoch(data::DistributedSampler& sampler, int64_t epoch) override {
    train_loader_->start_epoch(sampler, epoch);
  }
  // A record that cannot be read or decoded is bad data: a restart would meet it again.
  std::optional<data::Batch> next() override {
    return permanent_errors([this] { return train_loader_->next(); });
  }
  data::SamplerState position() const override { return train_loader_->position(); }
  data::Loader* test_loader() override { return test_loader_.get(); }
  std::vector<std::string> warnings() const override { return warnings_; }
  // The loader's queue, a batch in the making per worker, and the one in use.
  int64_t batches_in_flight() const override { return data::LoaderOptions{}.prefetch + train_loader_->threads() + 1; }
  void set_images(bool images) override {
    train_loader_->set_images(images);
    if (test_loader_) test_loader_->set_images(images);
  }
  std::vector<std::string> take_decode_warnings() override {
    std::vector<std::string> out;
    for (const auto& [loader, split] :
         {std::pair{train_loader_.get(), "train"}, std::pair{test_loader_.get(), "test"}}) {
      if (!loader) continue;
      const data::DecodeWarnings w = loader->take_decode_warnings();
      if (w.records > 0)
        out.push_back(detail::str_cat("split '", split, "': ", w.records, " record(s) decoded with libjpeg warnings ",
                                      "(damaged data: parts of them gray or garbled; first: ", w.first, ")"));
    }
    return out;
  }
  void stop() override {
    if (train_loader_) train_loader_->stop();
    if (test_loader_) test_loader_->stop();
  }

 private:
  // Loaders hold references to their datasets: declared after them, destroyed first.
  std::optional<data::ShardDataset> train_, test_;
  std::unique_ptr<data::Loader> train_loader_, test_loader_;
  DataInfo info_;
  std::vector<std::string> warnings_;

  // The model sees test images through the deterministic version of the training transform: the same
  // classes and the same image shape are needed, or evaluation would fail (or lie) after an epoch.
  static void check_test_fits(const std::string& dir, const data::SplitInfo& test, const data::SplitInfo& train,
                              data::Transform transform) {
    RT_CHECK(test.num_classes == train.num_classes, "--data '", dir, "': the test split has ", test.num_classes,
             " classes but the train split (and so the model) has ", train.num_classes);
    RT_CHECK(test.segmentation == train.segmentation && test.ignore_index == train.ignore_index, "--data '", dir,
             "': the test split holds ", test.segmentation ? "per-pixel masks" : "a label per image",
             " but the train split ", train.segmentation ? "per-pixel masks" : "a label per image");
    const auto a = data::transformed_shape(train, transform);
    transform.train = false;
    const auto b = data::transformed_shape(test, transform);
    RT_CHECK(a == b, "--data '", dir, "': the test split's images are ", test.shape_text(), " (", b[0], "x", b[1], "x",
             b[2], " after the transforms) but the train split's are ", train.shape_text(), " (", a[0], "x", a[1], "x",
             a[2], ")");
  }
};

class SyntheticSource final : public DataSource {
 public:
  explicit SyntheticSource(const SyntheticOptions& o) : options_(o) {
    RT_CHECK(o.size > 0 && o.height > 0 && o.width > 0 && o.channels > 0 && o.classes > 0,
             "synthetic data: size, shape and classes must be positive, got ", o.size, " records of ", o.height, "x",
             o.width, "x", o.channels, ", ", o.classes, " classes");
    info_ = {o.height,
             o.width,
             o.channels,
             o.classes,
             o.size,
             0,
             64,
             detail::str_cat("synthetic", o.segmentation ? " segmentation" : "", ": ", o.size, " records of ", o.height,
                             "x", o.width, "x", o.channels, ", ", o.classes, " classes"),
             o.segmentation,
             255};
  }
  const DataInfo& info() const override { return info_; }
  void set_images(bool images) override { images_ = images; }

  void start_epoch(data::DistributedSampler& sampler, int64_t epoch) override {
    epoch_ = epoch;
    next_ = sampler.state().next_batch;
    batches_ = sampler.batches_per_epoch();
    const int64_t batch = sampler.per_rank_batch();
    if (!labels_.defined() || labels_.numel() != batch || rank_ != sampler.options().rank) {
      rank_ = sampler.options().rank;
      std::vector<double> y(static_cast<size_t>(batch));
      for (int64_t i = 0; i < batch; ++i)
        y[static_cast<size_t>(i)] = static_cast<double>((i * 7 + rank_) % options_.classes);
      labels_ = Tensor::from_vector(y, Shape{batch}, DType::I64, options_.device);
    }
  }

  std::optional<data::Batch> next() override {
    if (next_ >= batches_) return std::nullopt;
    const int64_t batch = labels_.numel();
    // Drawn on the device itself: a host-made batch would put a CPU fill and a pageable copy of the
    // whole batch inside every timed step, which a benchmark must not measure.
    const uint64_t seed = options_.seed * 1000003u + static_cast<uint64_t>(epoch_) * 7919u +
                          static_cast<uint64_t>(next_) * 131u + static_cast<uint64_t>(rank_);
    data::Batch b;
    if (images_ || options_.segmentation)  // segmentation labels come from the images
      b.images = Tensor::normal(Shape{batch, info_.height, info_.width, info_.channels}, 0, 1, seed, DType::F32,
                                options_.device);
    b.labels = options_.segmentation ? pixel_classes(b.images) : labels_;
    if (!images_) b.images = Tensor();
    b.valid = batch;
    b.index = next_++;
    return b;
  }
  data::SamplerState position() const override { return {epoch_, next_}; }

 private:
  // (N, H, W) classes: band floor((x[..., 0] + 2) * classes / 4), clamped to the classes.
  Tensor pixel_classes(const Tensor& images) const {
    NoGradGuard no_grad;
    const int64_t n = images.size(0), h = images.size(1), w = images.size(2);
    const Tensor first = narrow(images, 3, 0, 1).reshape(Shape{n, h, w});
    const auto k = static_cast<double>(options_.classes);
    return clamp(mul(add(first, 2.0), k / 4.0), 0.0, k - 1.0).to(DType::I64);
  }
  SyntheticOptions options_;
  DataInfo info_;
  Tensor labels_;
  int64_t epoch_ = 0, next_ = 0, batches_ = 0;
  int rank_ = 0;  // the sampler's
  bool images_ = true;
};

}  // namespace

std::unique_ptr<DataSource> open_shards(const std::string& dir, const ShardSourceOptions& options) {
  // A missing, foreign or corrupt dataset is an error no restart fixes.
  return permanent_errors([&] { return std::make_unique<ShardSource>(dir, options); });
}

std::unique_ptr<DataSource> synthetic_data(const SyntheticOptions& options) {
  return std::make_unique<SyntheticSource>(options);
}

Tensor probe_labels(const DataInfo& info, int64_t n, Device device) {
  return info.segmentation ? Tensor::zeros(Shape{n, info.height, info.width}, DType::I64, device)
                           : Tensor::zeros(Shape{n}, DType::I64, device);
}

TrainerOptions with_data(TrainerOptions o, const DataInfo& info) {
  if (info.segmentation && !o.ignore_index) o.ignore_index = info.ignore_index;
  return o;
}

}  // namespace ringtrain::runtime
