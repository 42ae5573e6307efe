// Tests for data/loader.h: batches match the sampler, augmentation is deterministic across thread
// counts, transforms do what they say, errors surface, and stopping mid-epoch joins cleanly.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/check.h"
#include "data/loader.h"

namespace ringtrain::data {
namespace {
namespace fs = std::filesystem;

class LoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(::testing::TempDir()) / ("rt_loader_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    WriterOptions o;
    o.dir = dir_;
    o.split = "train";
    o.num_shards = 3;
    o.total_records = 64;
    o.height = 8;
    o.width = 6;
    o.channels = 3;
    o.num_classes = 4;
    ShardWriter w(o);
    std::vector<uint8_t> image(8 * 6 * 3);
    for (int r = 0; r < 64; ++r) {
      for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<uint8_t>((r * 3 + i) % 251);
      w.add(image.data(), r % 4);
    }
    w.finish();
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path dir_;
};
fs::path LoaderTest::dir_;

std::vector<std::vector<double>> run_epoch(const ShardDataset& ds, LoaderOptions lo, SamplerOptions so, int64_t epoch,
                                           std::vector<int64_t>* labels = nullptr) {
  DistributedSampler sampler(so);
  Loader loader(ds, lo);
  loader.start_epoch(sampler, epoch);
  std::vector<std::vector<double>> out;
  int64_t expect_index = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(b->index, expect_index++);
    out.push_back(b->images.to_vector());
    if (labels)
      for (double l : b->labels.to_vector()) labels->push_back(static_cast<int64_t>(l));
  }
  return out;
}

SamplerOptions sampler_options() {
  SamplerOptions so;
  so.dataset_size = 64;
  so.global_batch = 8;
  so.seed = 5;
  so.chunk = 4;
  so.window = 16;
  return so;
}

TEST_F(LoaderTest, BatchesFollowTheSamplerWithTheRightLabelsAndShape) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  LoaderOptions lo;
  lo.threads = 2;
  lo.transform.normalize = false;
  std::vector<int64_t> labels;
  auto batches = run_epoch(ds, lo, sampler_options(), 1, &labels);
  ASSERT_EQ(batches.size(), 8u);
  DistributedSampler s(sampler_options());
  auto order = s.epoch_order(1);
  for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(labels[i], order[i] % 4);
  // Without augmentation and normalisation, pixel = raw / 255.
  EXPECT_NEAR(batches[0][0], ((order[0] * 3) % 251) / 255.0, 1e-6);
}

TEST_F(LoaderTest, AugmentationIsIdenticalForOneAndThreeThreads) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  LoaderOptions lo;
  lo.transform.pad_crop = 2;
  lo.transform.hflip = true;
  lo.seed = 9;
  lo.threads = 1;
  auto one = run_epoch(ds, lo, sampler_options(), 0);
  lo.threads = 3;
  lo.prefetch = 2;
  auto three = run_epoch(ds, lo, sampler_options(), 0);
  EXPECT_EQ(one, three);
  EXPECT_NE(run_epoch(ds, lo, sampler_options(), 1), one) << "another epoch draws other augmentations";
}

TEST_F(LoaderTest, TransformsFlipCropAndNormalise) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  const SplitInfo& info = ds.info();
  std::vector<uint8_t> image(8 * 6 * 3);
  for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<uint8_t>(i);
  Transform t;
  t.train = false;
  t.normalize = false;
  std::vector<float> out(image.size());
  apply_transform(info, t, image.data(), 1, 0, 0, out.data());
  for (size_t i = 0; i < image.size(); ++i) ASSERT_FLOAT_EQ(out[i], image[i] / 255.0f);
  // Normalised with the split's mean/std.
  t.normalize = true;
  apply_transform(info, t, image.data(), 1, 0, 0, out.data());
  EXPECT_NEAR(out[1], (1 / 255.0 - info.mean[1]) / info.std[1], 1e-5);
  // Flip: find a sample index whose draw flips, and check mirrored columns.
  t.normalize = false;
  t.train = true;
  t.hflip = true;
  int flipped = 0;
  for (int64_t s = 0; s < 20; ++s) {
    apply_transform(info, t, image.data(), 1, 0, s, out.data());
    bool mirrored = std::abs(out[0] - image[5 * 3] / 255.0f) < 1e-6f;
    bool same = std::abs(out[0] - image[0] / 255.0f) < 1e-6f;
    EXPECT_TRUE(mirrored || same);
    flipped += mirrored;
  }
  EXPECT_GT(flipped, 3);
  EXPECT_LT(flipped, 17);
  // Resized crop gives the requested size, in bf16 too.
  t.resized_crop = 5;
  t.dtype = DType::BF16;
  EXPECT_EQ(transformed_shape(info, t), (std::array<int64_t, 3>{5, 5, 3}));
  std::vector<uint16_t> small(5 * 5 * 3);
  apply_transform(info, t, image.data(), 1, 0, 3, small.data());
  for (uint16_t bits : small) {
    float v = bf16_to_f32(BFloat16{bits});
    EXPECT_GE(v, 0.0f);
    EXPECT_LE(v, 1.0f);
  }
}

// The resized crop, evaluated (the centre square) so the window is known: bilinear at pixel centres with
// the four taps blended per pixel, exactly (the loader resizes rows once and blends them; same arithmetic).
TEST(Transform, ResizedCropIsBilinearAtPixelCentresBitwise) {
  for (const auto& [h, w, size] : {std::array<int64_t, 3>{20, 17, 24}, {37, 29, 16}, {9, 30, 9}}) {
    SplitInfo info;
    info.height = h;
    info.width = w;
    info.channels = 3;
    info.mean = {0.4f, 0.5f, 0.6f};
    info.std = {0.2f, 0.25f, 0.3f};
    std::vector<uint8_t> image(static_cast<size_t>(h * w * 3));
    uint32_t x = 99;
    for (auto& p : image) p = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
    Transform t;
    t.train = false;
    t.resized_crop = size;
    std::vector<float> out(static_cast<size_t>(size * size * 3));
    apply_transform(info, t, image.data(), 1, 0, 0, out.data());
    const double side = static_cast<double>(std::min(h, w)), y0c = std::floor((h - side) / 2), x0c = std::floor((w - side) / 2);
    const double step = side / static_cast<double>(size);
    for (int64_t oy = 0; oy < size; ++oy) {
      const double fy = std::clamp(y0c + (oy + 0.5) * step - 0.5, 0.0, static_cast<double>(h - 1));
      const int64_t r0 = static_cast<int64_t>(fy), r1 = std::min(r0 + 1, h - 1);
      const float wy = static_cast<float>(fy - static_cast<double>(r0));
      for (int64_t ox = 0; ox < size; ++ox) {
        const double fx = std::clamp(x0c + (ox + 0.5) * step - 0.5, 0.0, static_cast<double>(w - 1));
        const int64_t c0 = static_cast<int64_t>(fx), c1 = std::min(c0 + 1, w - 1);
        const float wx = static_cast<float>(fx - std::floor(fx));
        for (int64_t c = 0; c < 3; ++c) {
          auto px = [&](int64_t y, int64_t xx) { return image[static_cast<size_t>((y * w + xx) * 3 + c)]; };
          const float top = px(r0, c0) + (px(r0, c1) - px(r0, c0)) * wx;
          const float bottom = px(r1, c0) + (px(r1, c1) - px(r1, c0)) * wx;
          const float scale = static_cast<float>(1.0 / (255.0 * info.std[static_cast<size_t>(c)]));
          const float shift = static_cast<float>(-info.mean[static_cast<size_t>(c)] / info.std[static_cast<size_t>(c)]);
          const float want = (top + (bottom - top) * wy) * scale + shift;
          ASSERT_EQ(out[static_cast<size_t>((oy * size + ox) * 3 + c)], want)
              << h << "x" << w << " -> " << size << " at " << oy << "," << ox << "," << c;
        }
      }
    }
  }
}

TEST_F(LoaderTest, ResumedEpochKeepsBatchNumbersAndAugmentation) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  LoaderOptions lo;
  lo.transform.pad_crop = 2;
  lo.transform.hflip = true;
  lo.seed = 4;
  auto full = run_epoch(ds, lo, sampler_options(), 2);
  DistributedSampler sampler(sampler_options());
  sampler.restore({2, 5});
  Loader loader(ds, lo);
  loader.start_epoch(sampler, 2);
  auto b = loader.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->index, 5);
  EXPECT_EQ(b->images.to_vector(), full[5]) << "same samples and augmentation as batch 5 of the full epoch";
  EXPECT_EQ(loader.position().epoch, 2);
  EXPECT_EQ(loader.position().next_batch, 6) << "what a checkpoint taken now must record";
}

TEST_F(LoaderTest, PaddingSlotsComeLastAndAreCounted) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  Loader loader(ds, LoaderOptions{});
  loader.start({{5, 6, -1, -1}, {7}}, 0);
  auto first = loader.next();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->valid, 2);
  EXPECT_EQ(first->images.size(0), 4);
  auto second = loader.next();
  ASSERT_TRUE(second);
  EXPECT_EQ(second->valid, 1);
  EXPECT_FALSE(loader.next());
  EXPECT_THROW(loader.start({{64}}, 0), Error);
}

TEST_F(LoaderTest, StoppingMidEpochJoinsAndRestartWorks) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  LoaderOptions lo;
  lo.threads = 3;
  lo.prefetch = 2;
  for (int round = 0; round < 20; ++round) {
    Loader loader(ds, lo);
    DistributedSampler s(sampler_options());
    loader.start_epoch(s, round);
    ASSERT_TRUE(loader.next());
    // Destroyed here with workers blocked on the full queue: must join, not hang.
  }
  Loader loader(ds, lo);
  DistributedSampler s(sampler_options());
  loader.start_epoch(s, 0);
  loader.next();
  loader.stop();
  EXPECT_FALSE(loader.next());
  loader.start_epoch(s, 1);
  int n = 0;
  while (loader.next()) ++n;
  EXPECT_EQ(n, 8);
}

TEST_F(LoaderTest, WorkerErrorsSurfaceInNextWithContext) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  LoaderOptions lo;
  lo.transform.resized_crop = 4;
  lo.threads = 2;
  Loader loader(ds, lo);
  fs::path victim = dir_ / ds.info().shards[1].file;
  // Make reads fail after open: hide the shard file so a (re)open fails inside a worker.
  fs::rename(victim, victim.string() + ".away");
  loader.start({{0}, {30}}, 0);
  bool threw = false;
  try {
    while (loader.next()) {
    }
  } catch (const Error& e) {
    threw = true;
    std::string w = e.what();
    EXPECT_NE(w.find("batch 1"), std::string::npos) << w;
    EXPECT_NE(w.find(ds.info().shards[1].file), std::string::npos) << w;
  }
  fs::rename(victim.string() + ".away", victim);
  EXPECT_TRUE(threw);
}

}  // namespace
}  // namespace ringtrain::data

namespace ringtrain::data {
namespace {

TEST_F(LoaderTest, GpuBatchesEqualCpuBatches) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_status().reason;
  ShardDataset ds = ShardDataset::open(dir_, "train");
  LoaderOptions lo;
  lo.transform.pad_crop = 2;
  lo.seed = 3;
  auto cpu = run_epoch(ds, lo, sampler_options(), 0);
  lo.device = Device::cuda(0);
  auto gpu = run_epoch(ds, lo, sampler_options(), 0);  // to_vector() copies back through the current stream
  EXPECT_EQ(cpu, gpu);
}

}  // namespace
}  // namespace ringtrain::data
