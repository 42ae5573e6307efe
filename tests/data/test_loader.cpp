// Tests for data/loader.h: batches match the sampler, augmentation is deterministic across thread
// counts, transforms do what they say, errors surface, and stopping mid-epoch joins cleanly.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include <hdf5.h>
#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/check.h"
#include "core/parse.h"
#include "data/codec.h"
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

// A pipeline's last stage reads labels only: the same labels in the same batches, no images decoded.
TEST_F(LoaderTest, LabelsOnlyBatchesCarryTheSameLabelsAndNoImages) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  LoaderOptions lo;
  lo.threads = 2;
  std::vector<int64_t> with_images, labels_only;
  run_epoch(ds, lo, sampler_options(), 2, &with_images);
  Loader loader(ds, lo);
  loader.set_images(false);
  DistributedSampler sampler(sampler_options());
  loader.start_epoch(sampler, 2);
  while (auto b = loader.next()) {
    EXPECT_FALSE(b->images.defined());
    EXPECT_EQ(b->valid, 8);
    for (double l : b->labels.to_vector()) labels_only.push_back(static_cast<int64_t>(l));
  }
  EXPECT_EQ(labels_only, with_images);
  // Between epochs only.
  loader.start_epoch(sampler, 3);
  std::string error;
  try {
    loader.set_images(true);
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("call it between epochs"), std::string::npos) << error;
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
    const double side = static_cast<double>(std::min(h, w)), y0c = std::floor((h - side) / 2),
                 x0c = std::floor((w - side) / 2);
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

// Nice values of this process's threads, from /proc/self/task/*/stat (field 19).
std::vector<int> thread_nice_values() {
  std::vector<int> out;
  for (const auto& task : fs::directory_iterator("/proc/self/task")) {
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');  // the name may hold spaces; fields after it are plain
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string f;
    for (int i = 3; i <= 19 && fields >> f; ++i)
      if (i == 19) out.push_back(ringtrain::parse_number<int>(task.path().string() + "/stat field 19", f));
  }
  return out;
}

TEST_F(LoaderTest, WorkersRunAtALowerPriorityThanTheCaller) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  errno = 0;
  const int caller = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
  ASSERT_EQ(errno, 0);
  LoaderOptions lo;
  lo.threads = 2;
  lo.nice = 7;
  lo.prefetch = 1;
  Loader loader(ds, lo);
  std::vector<std::vector<int64_t>> batches(20, std::vector<int64_t>{0, 1});
  loader.start(batches, 0);
  ASSERT_TRUE(loader.next());  // the workers are running, and wait for the consumer (prefetch 1)
  const int target = std::min(19, caller + 7);
  EXPECT_EQ(loader.worker_nice(), target);
  // next() returning shows one worker ran; the other lowers its priority as soon as it is scheduled.
  std::vector<int> nice = thread_nice_values();
  for (int tries = 0; tries < 500 && std::count(nice.begin(), nice.end(), target) < 2; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    nice = thread_nice_values();
  }
  EXPECT_GE(std::count(nice.begin(), nice.end(), target), 2) << "both workers at nice " << target;
  EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())), caller) << "the caller keeps its priority";
  loader.stop();
  lo.nice = 0;
  Loader same(ds, lo);
  same.start({{0, 1}}, 0);
  ASSERT_TRUE(same.next());
  EXPECT_EQ(same.worker_nice(), caller);
  lo.nice = 20;
  EXPECT_THROW(Loader(ds, lo), Error);
}

// ------------------------------------------------------------------------------ encoded records (JPEG)

// A smooth RGB image with one bright square on a dark background (its centre marks where the crop is).
std::vector<uint8_t> square_on_gradient(int64_t h, int64_t w, int64_t sy, int64_t sx, int64_t side) {
  std::vector<uint8_t> out(static_cast<size_t>(h * w * 3));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        const bool in = y >= sy && y < sy + side && x >= sx && x < sx + side;
        out[static_cast<size_t>((y * w + x) * 3 + c)] =
            static_cast<uint8_t>(in ? 230 : 20 + (x * 40 / w) + (y * 30 / h) + 10 * c);
      }
  return out;
}

SplitInfo rgb_info() {
  SplitInfo info;
  info.split = "train";
  info.channels = 3;
  info.mean = {0.4f, 0.5f, 0.6f};
  info.std = {0.2f, 0.25f, 0.3f};
  return info;
}

// The centroid (y, x) of the pixels whose channel 0 is above the midpoint between square and background,
// and their count; a count of 0 when the square is absent or cut by the crop (then blur on its one inner
// edge would move the centroid).
std::array<double, 3> bright_centroid(const std::vector<float>& img, int64_t size) {
  double sy = 0, sx = 0, n = 0;
  for (int64_t y = 0; y < size; ++y)
    for (int64_t x = 0; x < size; ++x)
      if (img[static_cast<size_t>((y * size + x) * 3)] > 0.55f) {
        if (y == 0 || x == 0 || y == size - 1 || x == size - 1) return {-1, -1, 0};
        sy += static_cast<double>(y), sx += static_cast<double>(x), ++n;
      }
  return n > 0 ? std::array<double, 3>{sy / n, sx / n, n} : std::array<double, 3>{-1, -1, 0};
}

TEST(Transform, DctScaledDecodeKeepsTheCropGeometry) {
  // 1200x1600: every random crop (at least 8% of the area, so 339+ pixels a side) is at least twice the
  // 112-pixel output, so every one is decoded at 1/2, 1/4 or 1/8.
  const int64_t H = 1200, W = 1600, size = 112;
  const std::vector<uint8_t> pixels = square_on_gradient(H, W, 400, 600, 300);
  const std::vector<uint8_t> bytes = encode_jpeg(pixels.data(), H, W, 3, 95);
  const SplitInfo info = rgb_info();
  Transform t;
  t.resized_crop = size;
  t.hflip = true;
  t.normalize = false;
  Transform full = t;
  full.dct_scaling = false;
  full.region_decode = false;
  double worst_mean = 0, worst_shift = 0, mean_shift[2] = {0, 0};
  int with_square = 0;
  for (int64_t sample = 0; sample < 48; ++sample) {
    std::vector<float> a(static_cast<size_t>(size * size * 3)), b(a.size());
    decode_transform(info, t, bytes.data(), bytes.size(), {H, W, 3}, 7, 0, sample, a.data());
    decode_transform(info, full, bytes.data(), bytes.size(), {H, W, 3}, 7, 0, sample, b.data());
    double total = 0;
    for (size_t i = 0; i < a.size(); ++i) total += std::abs(a[i] - b[i]);
    worst_mean = std::max(worst_mean, total / static_cast<double>(a.size()));
    const auto ca = bright_centroid(a, size), cb = bright_centroid(b, size);
    if (cb[2] >= 50 && ca[2] > 0) {
      ++with_square;
      worst_shift = std::max({worst_shift, std::abs(ca[0] - cb[0]), std::abs(ca[1] - cb[1])});
      mean_shift[0] += ca[0] - cb[0];
      mean_shift[1] += ca[1] - cb[1];
    }
  }
  // Resampling differs (the DCT averages, bilinear does not), the geometry must not: a crop window mapped
  EXPECT_LT(worst_mean, 0.02) << "mean |difference| of pixel/255 against the full-size decode";
  // wrongly by half a scaled pixel moves the square's centroid the same way in every crop.
  ASSERT_GE(with_square, 10) << "too few crops saw the whole square to check the geometry";
  EXPECT_LT(worst_shift, 0.4) << "the square's centroid moved (output pixels)";
  EXPECT_LT(std::abs(mean_shift[0]) / with_square, 0.05) << "a systematic vertical shift (output pixels)";
  EXPECT_LT(std::abs(mean_shift[1]) / with_square, 0.05) << "a systematic horizontal shift (output pixels)";
}

TEST(Transform, RegionDecodeAtFullSizeMatchesTheWholeDecode) {
  const int64_t H = 333, W = 517, size = 96;
  const std::vector<uint8_t> pixels = square_on_gradient(H, W, 100, 200, 90);
  const std::vector<uint8_t> bytes = encode_jpeg(pixels.data(), H, W, 3, 90);
  const SplitInfo info = rgb_info();
  Transform region;
  region.resized_crop = size;
  region.hflip = true;
  region.dct_scaling = false;
  Transform whole = region;
  whole.region_decode = false;
  for (int64_t sample = 0; sample < 16; ++sample) {
    std::vector<float> a(static_cast<size_t>(size * size * 3)), b(a.size());
    decode_transform(info, region, bytes.data(), bytes.size(), {H, W, 3}, 3, 1, sample, a.data());
    decode_transform(info, whole, bytes.data(), bytes.size(), {H, W, 3}, 3, 1, sample, b.data());
    float worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    // The same pixels and taps; only the crop's origin is subtracted in another order.
    EXPECT_LT(worst, 1e-4f) << "sample " << sample;
  }
  // Evaluation (train = false) is the central square at full size too.
  region.train = whole.train = false;
  std::vector<float> a(static_cast<size_t>(size * size * 3)), b(a.size());
  decode_transform(info, region, bytes.data(), bytes.size(), {H, W, 3}, 3, 1, 0, a.data());
  decode_transform(info, whole, bytes.data(), bytes.size(), {H, W, 3}, 3, 1, 0, b.data());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4f) << i;
}

TEST(Transform, AnEncodedRecordOfTheWrongShapeIsAnError) {
  const std::vector<uint8_t> pixels = square_on_gradient(40, 50, 5, 5, 10);
  const std::vector<uint8_t> bytes = encode_jpeg(pixels.data(), 40, 50, 3, 90);
  const SplitInfo info = rgb_info();
  Transform t;
  t.resized_crop = 16;
  std::vector<float> out(16 * 16 * 3);
  for (bool crop : {true, false}) {
    if (!crop) t.resized_crop = 0;
    try {
      decode_transform(info, t, bytes.data(), bytes.size(), {41, 50, 3}, 0, 0, 0, out.data());
      ADD_FAILURE() << "a 40x50 image where 41x50 was expected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("decodes to 40x50x3, expected 41x50x3"), std::string::npos) << e.what();
    }
  }
}

// A split of JPEGs of their own sizes: record r is (60 + 13 r % 50) x (70 + 29 r % 60).
class VariedLoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(::testing::TempDir()) / ("rt_loader_varied_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    WriterOptions o;
    o.dir = dir_;
    o.split = "train";
    o.num_shards = 2;
    o.total_records = 32;
    o.channels = 3;
    o.num_classes = 4;
    o.encoded = true;
    ShardWriter w(o);
    for (int r = 0; r < 32; ++r) {
      const int64_t h = 60 + (13 * r) % 50, wd = 70 + (29 * r) % 60;
      const std::vector<uint8_t> pixels = square_on_gradient(h, wd, r % 20, r % 30, 25);
      const int64_t hwc[3] = {h, wd, 3};
      std::vector<double> sums(3, 0.0), squares(3, 0.0);
      for (size_t i = 0; i < pixels.size(); ++i)
        sums[i % 3] += pixels[i] / 255.0, squares[i % 3] += pixels[i] * pixels[i] / 65025.0;
      w.add_encoded(encode_jpeg(pixels.data(), h, wd, 3, 90), hwc, r % 4, sums, squares);
    }
    w.finish();
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static SamplerOptions sampler() {
    SamplerOptions so;
    so.dataset_size = 32;
    so.global_batch = 8;
    so.seed = 2;
    return so;
  }
  static fs::path dir_;
};
fs::path VariedLoaderTest::dir_;

TEST_F(VariedLoaderTest, RandomResizedCropsAreIdenticalForAnyThreadCount) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  ASSERT_TRUE(ds.info().varied_size());
  LoaderOptions lo;
  lo.transform.resized_crop = 32;
  lo.transform.hflip = true;
  lo.seed = 4;
  lo.threads = 1;
  std::vector<int64_t> labels;
  auto one = run_epoch(ds, lo, sampler(), 0, &labels);
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(one[0].size(), 8u * 32 * 32 * 3);
  DistributedSampler s(sampler());
  const auto order = s.epoch_order(0);
  for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(labels[i], order[i] % 4);
  lo.threads = 3;
  lo.prefetch = 1;
  EXPECT_EQ(run_epoch(ds, lo, sampler(), 0), one);
  EXPECT_NE(run_epoch(ds, lo, sampler(), 1), one) << "another epoch draws other crops";
  // Evaluation: the deterministic central crop, the same in every epoch.
  lo.transform.train = false;
  auto central = [&](int64_t epoch) {
    Loader loader(ds, lo);
    loader.start({{0, 1, 2, 3, 4, 5, 6, 7}}, epoch);
    return loader.next()->images.to_vector();
  };
  EXPECT_EQ(central(0), central(3));
}

TEST_F(VariedLoaderTest, WithoutAResizedCropThereIsNoShapeToLoadInto) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  LoaderOptions lo;
  try {
    Loader loader(ds, lo);
    ADD_FAILURE() << "a loader without a random-resized crop on a split of varied sizes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds images of varied sizes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--image-size"), std::string::npos) << e.what();
  }
}

TEST_F(VariedLoaderTest, ARecordThatDisagreesWithItsShapeNamesShardAndRecord) {
  // Copy the dataset and swap record 1's bytes for record 0's (another size) in shard 0's /encoded is
  // too intricate; instead point record 1's /shapes row at another size.
  const fs::path copy = dir_.string() + "_bad";
  fs::remove_all(copy);
  fs::copy(dir_, copy);
  {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    hid_t f = H5Fopen((copy / "train-00000-of-00002.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t d = H5Dopen2(f, "shapes", H5P_DEFAULT);
    std::vector<int32_t> shapes(16 * 3);
    H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, shapes.data());
    shapes[3] += 1;  // record 1: one row taller than its JPEG
    H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, shapes.data());
    H5Dclose(d);
    H5Fclose(f);
  }
  ShardDataset::OpenOptions no_crc;
  no_crc.verify_checksums = false;
  ShardDataset ds = ShardDataset::open(copy, "train", no_crc);
  LoaderOptions lo;
  lo.transform.resized_crop = 16;
  Loader loader(ds, lo);
  loader.start({{0, 1}}, 0);
  try {
    while (loader.next()) {
    }
    ADD_FAILURE() << "record 1 decodes to another size than /shapes says";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("train-00000-of-00002.h5', '/encoded' record 1: decodes to"), std::string::npos) << w;
  }
  fs::remove_all(copy);
}

TEST(Transform, ResizedCropsOfTinyImagesStayInsideThem) {
  // The AVX2 pass reads 4 bytes per tap and must only do so where rows follow (ASan checks the reads).
  for (const auto& [h, w, c] :
       {std::array<int64_t, 3>{2, 1, 1}, {1, 5, 1}, {3, 1, 1}, {1, 1, 3}, {4, 1, 2}, {2, 2, 1}}) {
    SplitInfo info;
    info.height = h;
    info.width = w;
    info.channels = c;
    std::vector<uint8_t> image(static_cast<size_t>(h * w * c));
    for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<uint8_t>(40 + 30 * i);
    Transform t;
    t.resized_crop = 8;
    t.normalize = false;
    t.hflip = true;
    const auto [lo, hi] = std::minmax_element(image.begin(), image.end());
    for (int64_t sample = 0; sample < 8; ++sample) {
      std::vector<float> out(static_cast<size_t>(8 * 8 * c));
      apply_transform(info, t, image.data(), 1, 0, sample, out.data());
      for (float v : out) {
        ASSERT_GE(v, *lo / 255.0f - 1e-6f) << h << "x" << w << "x" << c;
        ASSERT_LE(v, *hi / 255.0f + 1e-6f) << h << "x" << w << "x" << c;
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

// ------------------------------------------------------------------------------------------------ segmentation

// 16 records of 8x6x3 whose channel 0 and mask both hold each pixel's position + 1 (1..48; 50 classes): wherever
// the image's pixel lands after the transform, its label must be that same number.
class SegmentationLoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(::testing::TempDir()) / ("rt_loader_seg_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    WriterOptions o;
    o.dir = dir_;
    o.split = "train";
    o.num_shards = 2;
    o.total_records = 16;
    o.height = 8;
    o.width = 6;
    o.channels = 3;
    o.num_classes = 50;
    o.segmentation = true;
    ShardWriter w(o);
    std::vector<uint8_t> image(8 * 6 * 3), mask(8 * 6);
    for (int r = 0; r < 16; ++r) {
      for (int p = 0; p < 48; ++p) {
        image[static_cast<size_t>(p * 3)] = static_cast<uint8_t>(p + 1);
        image[static_cast<size_t>(p * 3 + 1)] = static_cast<uint8_t>(r);
        image[static_cast<size_t>(p * 3 + 2)] = 200;
        mask[static_cast<size_t>(p)] = static_cast<uint8_t>(p + 1);
      }
      w.add(image.data(), 0, mask.data());
    }
    w.finish();
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static SamplerOptions sampler() {
    SamplerOptions so;
    so.dataset_size = 16;
    so.global_batch = 4;
    so.seed = 3;
    return so;
  }
  static fs::path dir_;
};
fs::path SegmentationLoaderTest::dir_;

TEST_F(SegmentationLoaderTest, EachMaskFollowsItsImageThroughPadCropAndFlip) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  LoaderOptions lo;
  lo.threads = 2;
  lo.seed = 4;
  lo.transform.pad_crop = 3;
  lo.transform.hflip = true;
  lo.transform.normalize = false;
  Loader loader(ds, lo);
  DistributedSampler s(sampler());
  loader.start_epoch(s, 1);
  int64_t outside = 0, flipped = 0, batches = 0;
  while (auto b = loader.next()) {
    ++batches;
    ASSERT_EQ(b->labels.shape(), (Shape{4, 8, 6}));
    ASSERT_EQ(b->labels.dtype(), DType::I64);
    const std::vector<double> images = b->images.to_vector(), labels = b->labels.to_vector();
    for (int64_t k = 0; k < 4; ++k)
      for (int64_t p = 0; p < 48; ++p) {
        const double pixel = std::round(images[static_cast<size_t>((k * 48 + p) * 3)] * 255);
        const double label = labels[static_cast<size_t>(k * 48 + p)];
        if (pixel == 0) {  // the crop's padding: ignored
          ASSERT_EQ(label, 255) << "batch " << b->index << " sample " << k << " pixel " << p;
          ++outside;
        } else {
          ASSERT_EQ(label, pixel) << "batch " << b->index << " sample " << k << " pixel " << p;
        }
      }
    // A flipped sample's first column comes from the image's last one (or the padding).
    for (int64_t k = 0; k < 4; ++k) {
      const double first = labels[static_cast<size_t>(k * 48)], second = labels[static_cast<size_t>(k * 48 + 1)];
      flipped += first != 255 && second != 255 && first > second;
    }
  }
  EXPECT_EQ(batches, 4);
  EXPECT_GT(outside, 0) << "no crop reached the padding: the test saw no ignored pixel";
  EXPECT_GT(flipped, 0) << "no sample flipped";
}

TEST_F(SegmentationLoaderTest, LabelsOnlyAndPaddingSlots) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  LoaderOptions lo;
  lo.transform.pad_crop = 2;
  lo.transform.hflip = true;
  std::vector<std::vector<double>> with_images, labels_only;
  for (bool images : {true, false}) {
    Loader loader(ds, lo);
    loader.set_images(images);
    DistributedSampler s(sampler());
    loader.start_epoch(s, 0);
    while (auto b = loader.next()) {
      EXPECT_EQ(b->images.defined(), images);
      (images ? with_images : labels_only).push_back(b->labels.to_vector());
    }
  }
  EXPECT_EQ(with_images, labels_only) << "a pipeline's last stage must see the masks the first stage's images had";
  // Evaluation padding: every pixel of a padding slot is ignored.
  Loader loader(ds, LoaderOptions{});
  loader.start({{5, -1}}, 0);
  auto b = loader.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->valid, 1);
  const std::vector<double> labels = b->labels.to_vector();
  for (int64_t p = 0; p < 48; ++p) {
    EXPECT_EQ(labels[static_cast<size_t>(p)], p + 1);
    EXPECT_EQ(labels[static_cast<size_t>(48 + p)], 255);
  }
}

TEST_F(SegmentationLoaderTest, ResizeTakesTheNearestMaskPixelAndTheBilinearImage) {
  ShardDataset ds = ShardDataset::open(dir_, "train");
  const SplitInfo& info = ds.info();
  Transform t;
  t.train = false;
  t.normalize = false;
  t.resize = 12;
  EXPECT_EQ(transformed_shape(info, t), (std::array<int64_t, 3>{12, 12, 3}));
  std::vector<uint8_t> mask(48), image(8 * 6 * 3);
  for (int p = 0; p < 48; ++p) {
    mask[static_cast<size_t>(p)] = static_cast<uint8_t>(p + 1);
    image[static_cast<size_t>(p * 3)] = static_cast<uint8_t>(p + 1);
    image[static_cast<size_t>(p * 3 + 1)] = image[static_cast<size_t>(p * 3 + 2)] = 90;
  }
  std::vector<int64_t> labels(144);
  apply_mask_transform(info, t, mask.data(), 1, 0, 0, labels.data());
  std::vector<float> out(144 * 3);
  apply_transform(info, t, image.data(), 1, 0, 0, out.data());
  for (int64_t y = 0; y < 12; ++y)
    for (int64_t x = 0; x < 12; ++x) {
      // Rows 8 -> 12 (scale 2/3), columns 6 -> 12 (scale 1/2), centres mapped back.
      const int64_t sy = static_cast<int64_t>((y + 0.5) * 8 / 12), sx = static_cast<int64_t>((x + 0.5) * 6 / 12);
      EXPECT_EQ(labels[static_cast<size_t>(y * 12 + x)], sy * 6 + sx + 1) << y << "," << x;
      // Bilinear: channel 0 within half a row (6) and half a column (1) of the nearest pixel's value, plus rounding.
      EXPECT_NEAR(out[static_cast<size_t>((y * 12 + x) * 3)] * 255, static_cast<double>(sy * 6 + sx + 1), 4.01);
      EXPECT_NEAR(out[static_cast<size_t>((y * 12 + x) * 3 + 1)] * 255, 90, 1e-3);
    }
  // A random-resized crop has no mask to follow.
  t.resize = 0;
  t.resized_crop = 4;
  try {
    apply_mask_transform(info, t, mask.data(), 1, 0, 0, labels.data());
    ADD_FAILURE() << "a mask through a random-resized crop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a random-resized crop"), std::string::npos) << e.what();
  }
  t.resize = 12;
  EXPECT_THROW(transformed_shape(info, t), Error);
}

}  // namespace
}  // namespace ringtrain::data
