// Tests for data/idx.h, data/codec.h and data/converters.h: idx reading (plain and gzipped) and its
// errors; JPEG/PNG decode/encode, format conversions, corrupt data and resizing; every converter on
// small generated sources read back through ShardDataset; and the real Fashion-MNIST files.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/codec.h"
#include "data/converters.h"
#include "data/idx.h"
#include "data/shards.h"

namespace ringtrain::data {
namespace {
namespace fs = std::filesystem;

// ------------------------------------------------------------------------------------------ helpers

class ConverterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / ("rt_conv_" + std::string(info->test_suite_name()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_gzip(const fs::path& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(v >> shift));
}

std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  for (uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// n images of rows x cols with pixel (i * 31 + p) % 256; labels i % 10.
void write_idx_pair(const fs::path& dir, const std::string& prefix, uint32_t n, uint32_t rows, uint32_t cols,
                    bool gzip) {
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * rows * cols), labels(n);
  for (size_t i = 0; i < n; ++i) {
    labels[i] = static_cast<uint8_t>(i % 10);
    for (size_t p = 0; p < static_cast<size_t>(rows) * cols; ++p)
      pixels[i * rows * cols + p] = static_cast<uint8_t>((i * 31 + p) % 256);
  }
  const fs::path images = dir / (prefix + "-images-idx3-ubyte"), label_file = dir / (prefix + "-labels-idx1-ubyte");
  fs::create_directories(dir);
  if (gzip) {
    write_gzip(images.string() + ".gz", idx_bytes(0x803, {n, rows, cols}, pixels));
    write_gzip(label_file.string() + ".gz", idx_bytes(0x801, {n}, labels));
  } else {
    write_bytes(images, idx_bytes(0x803, {n, rows, cols}, pixels));
    write_bytes(label_file, idx_bytes(0x801, {n}, labels));
  }
}

// Runs fn, expects ringtrain::Error whose message contains every one of `parts`; returns the message.
std::string expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
    return what;
  }
  ADD_FAILURE() << "no ringtrain::Error thrown";
  return "";
}

// A PNG built by hand (for bit depths and color types our encoder does not write): rows are the raw
// scanline bytes without the filter byte.
std::vector<uint8_t> handmade_png(uint32_t width, uint32_t height, uint8_t bit_depth, uint8_t color_type,
                                  const std::vector<std::vector<uint8_t>>& rows,
                                  const std::vector<uint8_t>& palette = {},
                                  const std::vector<uint8_t>& transparency = {}) {
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  auto chunk = [&png](const char* type, const std::vector<uint8_t>& data) {
    put_be32(png, static_cast<uint32_t>(data.size()));
    std::vector<uint8_t> body(type, type + 4);
    body.insert(body.end(), data.begin(), data.end());
    png.insert(png.end(), body.begin(), body.end());
    put_be32(png, static_cast<uint32_t>(crc32(0, body.data(), static_cast<uInt>(body.size()))));
  };
  std::vector<uint8_t> ihdr;
  put_be32(ihdr, width);
  put_be32(ihdr, height);
  ihdr.insert(ihdr.end(), {bit_depth, color_type, 0, 0, 0});
  chunk("IHDR", ihdr);
  if (!palette.empty()) chunk("PLTE", palette);
  if (!transparency.empty()) chunk("tRNS", transparency);
  std::vector<uint8_t> raw;
  for (const auto& row : rows) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), row.begin(), row.end());
  }
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::vector<uint8_t> compressed(size);
  EXPECT_EQ(compress(compressed.data(), &size, raw.data(), static_cast<uLong>(raw.size())), Z_OK);
  compressed.resize(size);
  chunk("IDAT", compressed);
  chunk("IEND", {});
  return png;
}

// height x width x channels with a per-channel constant value.
std::vector<uint8_t> solid(int64_t height, int64_t width, const std::vector<uint8_t>& color) {
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < height * width; ++i) out.insert(out.end(), color.begin(), color.end());
  return out;
}

// A smooth RGB gradient (JPEG-friendly).
std::vector<uint8_t> gradient(int64_t height, int64_t width) {
  std::vector<uint8_t> out;
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      out.insert(out.end(), {static_cast<uint8_t>(x * 255 / (width - 1)), static_cast<uint8_t>(y * 255 / (height - 1)),
                             static_cast<uint8_t>(128)});
  return out;
}

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  double total = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) total += std::abs(int{a[i]} - int{b[i]});
  return total / static_cast<double>(std::max<size_t>(a.size(), 1));
}

struct ReadBack {
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
};
ReadBack read_all(const ShardDataset& dataset) {
  ReadBack r;
  r.images.resize(static_cast<size_t>(dataset.size() * dataset.info().record_bytes()));
  r.labels.resize(static_cast<size_t>(dataset.size()));
  dataset.read_range(0, dataset.size(), r.images.data(), r.labels.data());
  return r;
}

// ---------------------------------------------------------------------------------------------- idx

using ConverterIdx = ConverterTest;

TEST_F(ConverterIdx, ReadsPlainFiles) {
  write_idx_pair(dir_, "train", 5, 3, 4, /*gzip=*/false);
  IdxSplit split = read_idx_split(dir_ / "train-images-idx3-ubyte", dir_ / "train-labels-idx1-ubyte");
  EXPECT_EQ(split.images.count, 5);
  EXPECT_EQ(split.images.rows, 3);
  EXPECT_EQ(split.images.cols, 4);
  ASSERT_EQ(split.images.pixels.size(), 60u);
  EXPECT_EQ(split.images.pixels[12 * 2 + 5], (2 * 31 + 5) % 256);
  ASSERT_EQ(split.labels.labels.size(), 5u);
  EXPECT_EQ(split.labels.labels[4], 4);
  EXPECT_EQ(split.images.path, dir_ / "train-images-idx3-ubyte");
}

TEST_F(ConverterIdx, ReadsGzippedFilesWhenOnlyGzExists) {
  write_idx_pair(dir_, "t10k", 7, 2, 2, /*gzip=*/true);
  IdxSplit split = read_idx_split(dir_ / "t10k-images-idx3-ubyte", dir_ / "t10k-labels-idx1-ubyte");
  EXPECT_EQ(split.images.path, dir_ / "t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(split.images.count, 7);
  EXPECT_EQ(split.images.pixels[4 * 6 + 3], (6 * 31 + 3) % 256);
  EXPECT_EQ(split.labels.labels[6], 6);
}

TEST_F(ConverterIdx, MissingFileNamesIt) {
  expect_error([&] { read_idx_images(dir_ / "nope-images-idx3-ubyte"); },
               {(dir_ / "nope-images-idx3-ubyte").string(), "not found", ".gz"});
}

TEST_F(ConverterIdx, BadMagicNamesFile) {
  write_bytes(dir_ / "x", idx_bytes(0x801, {3}, {0, 1, 2}));
  expect_error([&] { read_idx_images(dir_ / "x"); }, {(dir_ / "x").string(), "bad magic", "0x00000801"});
  write_bytes(dir_ / "y", idx_bytes(0x803, {1, 1, 1}, {0}));
  expect_error([&] { read_idx_labels(dir_ / "y"); }, {(dir_ / "y").string(), "bad magic"});
}

TEST_F(ConverterIdx, TruncatedFileNamesIt) {
  write_bytes(dir_ / "short", idx_bytes(0x803, {3, 2, 2}, std::vector<uint8_t>(8)));  // needs 12
  expect_error([&] { read_idx_images(dir_ / "short"); }, {(dir_ / "short").string(), "truncated"});
  write_bytes(dir_ / "header", {0, 0, 8, 3, 0, 0});
  expect_error([&] { read_idx_images(dir_ / "header"); }, {(dir_ / "header").string(), "truncated"});
  write_bytes(dir_ / "long", idx_bytes(0x801, {2}, {1, 2, 3}));
  expect_error([&] { read_idx_labels(dir_ / "long"); }, {(dir_ / "long").string(), "bytes after"});
}

TEST_F(ConverterIdx, CorruptGzipNamesFile) {
  write_idx_pair(dir_, "train", 50, 8, 8, /*gzip=*/true);
  const fs::path gz = dir_ / "train-images-idx3-ubyte.gz";
  std::vector<uint8_t> bytes = read_bytes(gz);
  bytes.resize(bytes.size() / 2);
  write_bytes(gz, bytes);
  expect_error([&] { read_idx_images(dir_ / "train-images-idx3-ubyte"); }, {gz.string(), "corrupt"});
}

TEST_F(ConverterIdx, CountMismatchNamesBothFiles) {
  write_idx_pair(dir_, "train", 4, 2, 2, false);
  write_bytes(dir_ / "train-labels-idx1-ubyte", idx_bytes(0x801, {3}, {0, 1, 2}));
  expect_error([&] { read_idx_split(dir_ / "train-images-idx3-ubyte", dir_ / "train-labels-idx1-ubyte"); },
               {(dir_ / "train-images-idx3-ubyte").string(), (dir_ / "train-labels-idx1-ubyte").string(), "4 images",
                "3 labels"});
}

TEST_F(ConverterIdx, ConvertsMnistLayoutToShards) {
  const fs::path src = dir_ / "src", out = dir_ / "out";
  write_idx_pair(src, "train", 30, 5, 4, /*gzip=*/true);
  write_idx_pair(src, "t10k", 10, 5, 4, /*gzip=*/false);
  ConvertOptions options;
  options.num_shards = 3;
  ConvertResult result = convert_idx(src, out, "mnist", options);
  ASSERT_EQ(result.splits.size(), 2u);
  EXPECT_EQ(result.splits[0].shards.size(), 3u);
  EXPECT_EQ(result.splits[1].shards.size(), 1u);  // ceil(3 * 10 / 30)

  ShardDataset train = ShardDataset::open(out, "train");
  EXPECT_EQ(train.size(), 30);
  EXPECT_EQ(train.info().height, 5);
  EXPECT_EQ(train.info().width, 4);
  EXPECT_EQ(train.info().channels, 1);
  EXPECT_EQ(train.info().num_classes, 10);
  EXPECT_EQ(train.info().classes, (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}));
  EXPECT_EQ(train.info().source.rfind("mnist:", 0), 0u) << train.info().source;
  ReadBack r = read_all(train);
  for (int64_t i = 0; i < 30; ++i) {
    EXPECT_EQ(r.labels[static_cast<size_t>(i)], i % 10);
    EXPECT_EQ(r.images[static_cast<size_t>(i * 20 + 7)], (i * 31 + 7) % 256);
  }
  EXPECT_EQ(ShardDataset::open(out, "test").size(), 10);
}

TEST_F(ConverterIdx, LabelOutOfRangeNamesFile) {
  const fs::path src = dir_ / "src";
  write_idx_pair(src, "train", 3, 2, 2, false);
  write_idx_pair(src, "t10k", 2, 2, 2, false);
  write_bytes(src / "t10k-labels-idx1-ubyte", idx_bytes(0x801, {2}, {1, 12}));
  expect_error([&] { convert_idx(src, dir_ / "out", "fashion-mnist", {}); },
               {(src / "t10k-labels-idx1-ubyte").string(), "label 12", "record 1"});
  EXPECT_FALSE(fs::exists(dir_ / "out" / "manifest.json"));  // nothing written before the check
  expect_error([&] { convert_idx(src, dir_ / "out", "kmnist", {}); }, {"kmnist"});
}

// -------------------------------------------------------------------------------------------- codec

using ConverterCodec = ConverterTest;

TEST_F(ConverterCodec, DetectsFormatByMagic) {
  const std::vector<uint8_t> png = encode_png(solid(2, 2, {1}).data(), 2, 2, 1);
  const std::vector<uint8_t> jpeg = encode_jpeg(solid(8, 8, {1, 2, 3}).data(), 8, 8, 3, 90);
  EXPECT_EQ(detect_image_format(png.data(), png.size()), ImageFormat::kPng);
  EXPECT_EQ(detect_image_format(jpeg.data(), jpeg.size()), ImageFormat::kJpeg);
  const std::vector<uint8_t> gif = {'G', 'I', 'F', '8', '9', 'a', 0, 0};
  EXPECT_EQ(detect_image_format(gif.data(), gif.size()), ImageFormat::kUnknown);
  expect_error([&] { decode_image(gif.data(), gif.size()); }, {"not a JPEG or PNG", "47 49 46"});
  expect_error([&] { decode_image(nullptr, 0); }, {"not a JPEG or PNG", "0 bytes"});
}

TEST_F(ConverterCodec, PngRoundTripsGrayAndRgbExactly) {
  std::vector<uint8_t> gray(6 * 5), rgb(6 * 5 * 3);
  std::iota(gray.begin(), gray.end(), uint8_t{3});
  std::iota(rgb.begin(), rgb.end(), uint8_t{100});
  DecodedImage g = decode_image(encode_png(gray.data(), 6, 5, 1).data(), encode_png(gray.data(), 6, 5, 1).size());
  EXPECT_EQ(g.height, 6);
  EXPECT_EQ(g.width, 5);
  EXPECT_EQ(g.channels, 1);
  EXPECT_EQ(g.pixels, gray);
  const std::vector<uint8_t> bytes = encode_png(rgb.data(), 6, 5, 3);
  DecodedImage c = decode_image(bytes.data(), bytes.size());
  EXPECT_EQ(c.channels, 3);
  EXPECT_EQ(c.pixels, rgb);
}

TEST_F(ConverterCodec, PngAlphaIsDropped) {
  const std::vector<uint8_t> rgba = solid(3, 4, {10, 20, 30, 77}), ga = solid(3, 4, {99, 0});
  const std::vector<uint8_t> a = encode_png(rgba.data(), 3, 4, 4), b = encode_png(ga.data(), 3, 4, 2);
  DecodedImage rgb = decode_image(a.data(), a.size());
  EXPECT_EQ(rgb.channels, 3);
  EXPECT_EQ(rgb.pixels, solid(3, 4, {10, 20, 30}));
  DecodedImage gray = decode_image(b.data(), b.size());
  EXPECT_EQ(gray.channels, 1);
  EXPECT_EQ(gray.pixels, solid(3, 4, {99}));
}

TEST_F(ConverterCodec, PngPaletteSixteenBitAndLowBitDepthBecomeEightBit) {
  // Palette (with a tRNS entry, which must not add a channel): indices 0, 1 / 1, 0.
  const std::vector<uint8_t> palette = handmade_png(2, 2, 8, 3, {{0, 1}, {1, 0}}, {255, 0, 0, 0, 0, 255}, {128});
  DecodedImage p = decode_image(palette.data(), palette.size());
  EXPECT_EQ(p.channels, 3);
  EXPECT_EQ(p.pixels, (std::vector<uint8_t>{255, 0, 0, 0, 0, 255, 0, 0, 255, 255, 0, 0}));
  // 16-bit gray: v * 257 scales back to exactly v.
  const std::vector<uint8_t> sixteen = handmade_png(2, 1, 16, 0, {{0x10, 0x10, 0xFE, 0xFE}});
  DecodedImage s = decode_image(sixteen.data(), sixteen.size());
  EXPECT_EQ(s.channels, 1);
  EXPECT_EQ(s.pixels, (std::vector<uint8_t>{0x10, 0xFE}));
  // 16-bit RGBA -> 8-bit RGB.
  const std::vector<uint8_t> rgba16 = handmade_png(1, 1, 16, 6, {{0x20, 0x20, 0x40, 0x40, 0x80, 0x80, 0xFF, 0xFF}});
  DecodedImage r = decode_image(rgba16.data(), rgba16.size());
  EXPECT_EQ(r.channels, 3);
  EXPECT_EQ(r.pixels, (std::vector<uint8_t>{0x20, 0x40, 0x80}));
  // 1-bit gray: 0b10100000 over 3 pixels -> 255, 0, 255.
  const std::vector<uint8_t> one = handmade_png(3, 1, 1, 0, {{0xA0}});
  DecodedImage o = decode_image(one.data(), one.size());
  EXPECT_EQ(o.channels, 1);
  EXPECT_EQ(o.pixels, (std::vector<uint8_t>{255, 0, 255}));
}

TEST_F(ConverterCodec, JpegRoundTripIsClose) {
  const std::vector<uint8_t> rgb = gradient(32, 48);
  const std::vector<uint8_t> bytes = encode_jpeg(rgb.data(), 32, 48, 3, 95);
  DecodedImage c = decode_image(bytes.data(), bytes.size());
  EXPECT_EQ(c.height, 32);
  EXPECT_EQ(c.width, 48);
  EXPECT_EQ(c.channels, 3);
  EXPECT_LT(mean_abs_diff(c.pixels, rgb), 2.0);

  std::vector<uint8_t> gray(16 * 16);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(i);
  const std::vector<uint8_t> gbytes = encode_jpeg(gray.data(), 16, 16, 1, 95);
  DecodedImage g = decode_image(gbytes.data(), gbytes.size());
  EXPECT_EQ(g.channels, 1);  // grayscale stays one channel
  EXPECT_LT(mean_abs_diff(g.pixels, gray), 2.0);
}

// A photo-like RGB test image: smooth colour fields, a few sharp edges and mild noise.
std::vector<uint8_t> textured(int64_t height, int64_t width) {
  std::vector<uint8_t> out(static_cast<size_t>(height * width * 3));
  uint32_t state = 12345;
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        double v = 128 + 60 * std::sin(0.031 * x + 0.7 * c) * std::cos(0.023 * y - 0.3 * c);
        if ((x / 37 + y / 29) % 5 == 0) v += 50;  // blocks with sharp edges
        state = state * 1664525u + 1013904223u;
        v += static_cast<double>(state >> 28) - 8;
        out[static_cast<size_t>((y * width + x) * 3 + c)] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return out;
}

TEST_F(ConverterCodec, RegionDecodeIsTheSameWindowOfAFullDecode) {
  const int64_t H = 203, W = 301;
  const std::vector<uint8_t> rgb = textured(H, W);
  const std::vector<uint8_t> bytes = encode_jpeg(rgb.data(), H, W, 3, 90);  // 4:2:0 (libjpeg's default)
  const DecodedImage full = decode_image(bytes.data(), bytes.size());
  struct Window {
    int64_t y0, x0, h, w;
  };
  for (const Window& want : {Window{0, 0, H, W}, Window{17, 33, 50, 90}, Window{150, 250, 53, 51},
                             Window{-5, -9, 20, 30}, Window{100, 5, 400, 400}, Window{60, 140, 1, 1}}) {
    int calls = 0;
    const DecodedRegion r = decode_image_region(bytes.data(), bytes.size(), [&](const ImageHeader& h) {
      ++calls;
      EXPECT_EQ(h.format, ImageFormat::kJpeg);
      EXPECT_EQ(h.height, H);
      EXPECT_EQ(h.width, W);
      EXPECT_EQ(h.channels, 3);
      return RegionRequest{1, want.y0, want.x0, want.h, want.w};
    });
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(r.scale, 1);
    EXPECT_EQ(r.scaled_height, H);
    EXPECT_EQ(r.scaled_width, W);
    // The region covers the window clamped to the image; rows exactly, columns from an iMCU boundary on.
    const int64_t y0 = std::clamp<int64_t>(want.y0, 0, H - 1), x0 = std::clamp<int64_t>(want.x0, 0, W - 1);
    const int64_t y1 = std::clamp<int64_t>(want.y0 + want.h, y0 + 1, H),
                  x1 = std::clamp<int64_t>(want.x0 + want.w, x0 + 1, W);
    EXPECT_EQ(r.y0, y0);
    EXPECT_EQ(r.image.height, y1 - y0);
    EXPECT_LE(r.x0, x0);
    EXPECT_GE(r.x0 + r.image.width, x1);
    EXPECT_EQ(r.x0 % 16, 0) << "an iMCU of 4:2:0 is 16 pixels wide";
    // Every pixel is the full decode's, except a region edge column inside the image (its chroma is
    // upsampled from a clamped neighbour).
    int64_t differ = 0;
    for (int64_t y = 0; y < r.image.height; ++y)
      for (int64_t x = 0; x < r.image.width; ++x) {
        const bool inner_edge = (x == 0 && r.x0 > 0) || (x == r.image.width - 1 && r.x0 + r.image.width < W);
        for (int64_t c = 0; c < 3; ++c) {
          const uint8_t a = r.image.pixels[static_cast<size_t>((y * r.image.width + x) * 3 + c)];
          const uint8_t b = full.pixels[static_cast<size_t>(((y + r.y0) * W + x + r.x0) * 3 + c)];
          if (inner_edge) {
            EXPECT_LE(std::abs(int{a} - int{b}), 24);
          } else if (a != b) {
            ++differ;
          }
        }
      }
    EXPECT_EQ(differ, 0) << "window " << want.y0 << "," << want.x0 << " " << want.h << "x" << want.w;
  }
}

TEST_F(ConverterCodec, DctScaledDecodeIsTheShrunkImage) {
  const int64_t H = 203, W = 301;
  const std::vector<uint8_t> rgb = textured(H, W);
  const std::vector<uint8_t> bytes = encode_jpeg(rgb.data(), H, W, 3, 95);
  const DecodedImage full = decode_image(bytes.data(), bytes.size());
  for (int64_t s : {2, 4, 8}) {
    const DecodedRegion r = decode_image_region(bytes.data(), bytes.size(), [&](const ImageHeader&) {
      return RegionRequest{s, 0, 0, H, W};
    });
    EXPECT_EQ(r.scale, s);
    EXPECT_EQ(r.scaled_height, (H + s - 1) / s);
    EXPECT_EQ(r.scaled_width, (W + s - 1) / s);
    EXPECT_EQ(r.image.height, r.scaled_height);
    EXPECT_EQ(r.image.width, r.scaled_width);
    // Each scaled pixel is about the mean of the s x s block of the full decode it stands for.
    double total = 0;
    int64_t count = 0;
    for (int64_t y = 0; y + 1 < r.image.height; ++y)
      for (int64_t x = 0; x + 1 < r.image.width; ++x)
        for (int64_t c = 0; c < 3; ++c) {
          double mean = 0;
          for (int64_t dy = 0; dy < s; ++dy)
            for (int64_t dx = 0; dx < s; ++dx)
              mean += full.pixels[static_cast<size_t>(((y * s + dy) * W + x * s + dx) * 3 + c)];
          mean /= static_cast<double>(s * s);
          total += std::abs(mean - r.image.pixels[static_cast<size_t>((y * r.image.width + x) * 3 + c)]);
          ++count;
        }
    EXPECT_LT(total / static_cast<double>(count), 4.0) << "scale 1/" << s;
  }
  // PNG has no DCT: whole, at scale 1, whatever was asked.
  const std::vector<uint8_t> png = encode_png(rgb.data(), H, W, 3);
  const DecodedRegion p = decode_image_region(png.data(), png.size(), [](const ImageHeader& h) {
    EXPECT_EQ(h.format, ImageFormat::kPng);
    return RegionRequest{4, 10, 10, 5, 5};
  });
  EXPECT_EQ(p.scale, 1);
  EXPECT_EQ(p.image.height, H);
  EXPECT_EQ(p.image.width, W);
  EXPECT_TRUE(p.image.pixels == rgb);
  // The largest scale that leaves at least the output size.
  EXPECT_EQ(dct_scale_for(300, 300, 224, 224), 1);
  EXPECT_EQ(dct_scale_for(448, 460, 224, 224), 2);
  EXPECT_EQ(dct_scale_for(460, 447, 224, 224), 1);
  EXPECT_EQ(dct_scale_for(1000, 1000, 224, 224), 4);
  EXPECT_EQ(dct_scale_for(4000, 4000, 224, 224), 8);
}

TEST_F(ConverterCodec, RegionDecodeErrorsAreClear) {
  const std::vector<uint8_t> rgb = textured(64, 64);
  std::vector<uint8_t> bytes = encode_jpeg(rgb.data(), 64, 64, 3, 90);
  expect_error(
      [&] {
        decode_image_region(bytes.data(), bytes.size(), [](const ImageHeader&) {
          return RegionRequest{3, 0, 0, 8, 8};
        });
      },
      {"scale must be 1, 2, 4 or 8, got 3"});
  expect_error(
      [&] {
        decode_image_region(bytes.data(), bytes.size(),
                            [](const ImageHeader&) -> RegionRequest { RT_THROW("chooser says no"); });
      },
      {"chooser says no"});
  bytes.resize(bytes.size() / 2);  // cut inside the scan: the rows the window needs are missing
  expect_error(
      [&] {
        decode_image_region(bytes.data(), bytes.size(), [](const ImageHeader&) {
          return RegionRequest{1, 40, 0, 20, 64};
        });
      },
      {"corrupt JPEG data"});
}

TEST_F(ConverterCodec, CorruptJpegThrowsInsteadOfExiting) {
  const std::vector<uint8_t> rgb = gradient(64, 64);
  std::vector<uint8_t> bytes = encode_jpeg(rgb.data(), 64, 64, 3, 90);
  std::vector<uint8_t> truncated(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2));
  expect_error([&] { decode_image(truncated.data(), truncated.size()); }, {"corrupt JPEG", "Premature end"});
  std::vector<uint8_t> header_only = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, 'J', 'F', 'I', 'F'};
  expect_error([&] { decode_image(header_only.data(), header_only.size()); }, {"corrupt JPEG"});
  std::vector<uint8_t> garbage(200, 0x5A);
  garbage[0] = 0xFF, garbage[1] = 0xD8, garbage[2] = 0xFF;
  expect_error([&] { decode_image(garbage.data(), garbage.size()); }, {"corrupt JPEG"});
}

TEST_F(ConverterCodec, CorruptPngThrows) {
  const std::vector<uint8_t> rgb = gradient(16, 16);
  const std::vector<uint8_t> bytes = encode_png(rgb.data(), 16, 16, 3);
  std::vector<uint8_t> truncated(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2));
  expect_error([&] { decode_image(truncated.data(), truncated.size()); }, {"corrupt PNG", "truncated"});
  std::vector<uint8_t> bad_crc = bytes;
  bad_crc[20] ^= 0xFF;  // inside IHDR's data: its CRC no longer matches
  expect_error([&] { decode_image(bad_crc.data(), bad_crc.size()); }, {"corrupt PNG"});
}

TEST_F(ConverterCodec, ResizeKeepsConstantsAndIdentity) {
  const std::vector<uint8_t> flat = solid(37, 53, {12, 200, 77});
  for (int64_t size : {8, 20, 37, 64}) {
    std::vector<uint8_t> out = resize_shorter_side_center_crop(flat.data(), 37, 53, 3, size);
    EXPECT_EQ(out, solid(size, size, {12, 200, 77})) << "size " << size;
  }
  std::vector<uint8_t> square(9 * 9 * 2);
  std::iota(square.begin(), square.end(), uint8_t{0});
  EXPECT_EQ(resize_shorter_side_center_crop(square.data(), 9, 9, 2, 9), square);
}

TEST_F(ConverterCodec, ResizeCropsTheCenterOfTheLongerSide) {
  // 4 x 12 gray: columns 0-3 are 0, 4-7 are 200, 8-11 are 50. Shorter side 4 -> no scaling; crop cols 4-7.
  std::vector<uint8_t> image(4 * 12);
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t x = 0; x < 12; ++x) image[static_cast<size_t>(y * 12 + x)] = x < 4 ? 0 : x < 8 ? 200 : 50;
  EXPECT_EQ(resize_shorter_side_center_crop(image.data(), 4, 12, 1, 4), solid(4, 4, {200}));
  // Tall: 12 x 4, rows 4-7 are the middle.
  std::vector<uint8_t> tall(12 * 4);
  for (int64_t y = 0; y < 12; ++y)
    for (int64_t x = 0; x < 4; ++x) tall[static_cast<size_t>(y * 4 + x)] = y < 4 ? 0 : y < 8 ? 200 : 50;
  EXPECT_EQ(resize_shorter_side_center_crop(tall.data(), 12, 4, 1, 4), solid(4, 4, {200}));
}

TEST_F(ConverterCodec, ResizeAveragesWhenShrinkingALot) {
  // A 1-pixel checkerboard shrunk 8x: area averaging gives ~127.5 everywhere; point sampling would alias.
  std::vector<uint8_t> board(64 * 64);
  for (int64_t y = 0; y < 64; ++y)
    for (int64_t x = 0; x < 64; ++x) board[static_cast<size_t>(y * 64 + x)] = (x + y) % 2 ? 255 : 0;
  for (uint8_t v : resize_shorter_side_center_crop(board.data(), 64, 64, 1, 8)) EXPECT_NEAR(v, 127.5, 1.0);
  // Bilinear 2x upscale of a ramp stays monotonic and within range.
  std::vector<uint8_t> ramp = {0, 100, 200, 0, 100, 200, 0, 100, 200};
  std::vector<uint8_t> up = resize_shorter_side_center_crop(ramp.data(), 3, 3, 1, 6);
  ASSERT_EQ(up.size(), 36u);
  for (int64_t x = 1; x < 6; ++x) EXPECT_GE(up[static_cast<size_t>(x)], up[static_cast<size_t>(x - 1)]);
  EXPECT_EQ(up[0], 0);
  EXPECT_EQ(up[5], 200);
}

TEST_F(ConverterCodec, ConvertChannels) {
  DecodedImage gray{1, 2, 1, {10, 250}, 0, ""};
  DecodedImage rgb = convert_channels(gray, 3);
  EXPECT_EQ(rgb.channels, 3);
  EXPECT_EQ(rgb.pixels, (std::vector<uint8_t>{10, 10, 10, 250, 250, 250}));
  DecodedImage back = convert_channels(DecodedImage{1, 1, 3, {255, 0, 0}, 0, ""}, 1);
  EXPECT_EQ(back.pixels, (std::vector<uint8_t>{76}));  // 0.299 * 255
}

// -------------------------------------------------------------------------------------------- CIFAR

using ConverterCifar = ConverterTest;

// A record of `label_bytes` labels then CHW planes: R = (r + p) % 256, G = 100 + r, B = 255 - r, except
// pixel (y 1, x 2) whose (R, G, B) = (200, 100, 50).
std::vector<uint8_t> cifar_records(int count, const std::vector<uint8_t>& labels_per_record, int first_label) {
  std::vector<uint8_t> out;
  for (int r = 0; r < count; ++r) {
    for (size_t k = 0; k < labels_per_record.size(); ++k)
      out.push_back(
          static_cast<uint8_t>(labels_per_record[k] + (k + 1 == labels_per_record.size() ? first_label + r : 0)));
    std::vector<uint8_t> planes(3072);
    for (int p = 0; p < 1024; ++p) {
      planes[static_cast<size_t>(p)] = static_cast<uint8_t>((r + p) % 256);
      planes[static_cast<size_t>(1024 + p)] = static_cast<uint8_t>(100 + r);
      planes[static_cast<size_t>(2048 + p)] = static_cast<uint8_t>(255 - r);
    }
    planes[1 * 32 + 2] = 200, planes[1024 + 1 * 32 + 2] = 100, planes[2048 + 1 * 32 + 2] = 50;
    out.insert(out.end(), planes.begin(), planes.end());
  }
  return out;
}

TEST_F(ConverterCifar, Cifar10ConvertsChwToHwcWithNames) {
  const fs::path bin = dir_ / "cifar-10-batches-bin", out = dir_ / "out";
  for (int b = 1; b <= 5; ++b)
    write_bytes(bin / ("data_batch_" + std::to_string(b) + ".bin"), cifar_records(2, {0}, 2 * (b - 1)));
  write_bytes(bin / "test_batch.bin", cifar_records(3, {0}, 4));
  std::ofstream(bin / "batches.meta.txt") << "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n";
  ConvertOptions options;
  options.num_shards = 2;
  ConvertResult result = convert_cifar(dir_, out, 10, options);  // the folder above the archive's works too
  ASSERT_EQ(result.splits.size(), 2u);
  EXPECT_TRUE(result.notes.empty());

  ShardDataset train = ShardDataset::open(out, "train");
  EXPECT_EQ(train.size(), 10);
  EXPECT_EQ(train.info().shards.size(), 2u);
  EXPECT_EQ(train.info().height, 32);
  EXPECT_EQ(train.info().channels, 3);
  ASSERT_EQ(train.info().classes.size(), 10u);
  EXPECT_EQ(train.info().classes[9], "truck");
  ReadBack r = read_all(train);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(r.labels[static_cast<size_t>(i)], i);
    const uint8_t* image = r.images.data() + i * 3072;
    const uint8_t* known = image + (1 * 32 + 2) * 3;
    EXPECT_EQ(known[0], 200);
    EXPECT_EQ(known[1], 100);
    EXPECT_EQ(known[2], 50);
    const int rec = i % 2;  // index within its batch file
    const uint8_t* p = image + (5 * 32 + 7) * 3;
    EXPECT_EQ(p[0], (rec + 5 * 32 + 7) % 256);
    EXPECT_EQ(p[1], 100 + rec);
    EXPECT_EQ(p[2], 255 - rec);
  }
  ShardDataset test = ShardDataset::open(out, "test");
  EXPECT_EQ(test.size(), 3);
  EXPECT_EQ(test.info().shards.size(), 1u);
}

TEST_F(ConverterCifar, Cifar100UsesFineLabels) {
  const fs::path bin = dir_ / "cifar-100-binary", out = dir_ / "out";
  write_bytes(bin / "train.bin", cifar_records(4, {7, 90}, 0));  // coarse 7, fine 90..93
  write_bytes(bin / "test.bin", cifar_records(2, {3, 10}, 0));
  ConvertResult result = convert_cifar(bin, out, 100, {});
  ASSERT_EQ(result.notes.size(), 1u);
  EXPECT_NE(result.notes[0].find("fine_label_names.txt"), std::string::npos);
  ShardDataset train = ShardDataset::open(out, "train");
  EXPECT_EQ(train.info().num_classes, 100);
  ReadBack r = read_all(train);
  EXPECT_EQ(r.labels, (std::vector<int32_t>{90, 91, 92, 93}));
  EXPECT_EQ(r.images[(1 * 32 + 2) * 3 + 2], 50);
}

TEST_F(ConverterCifar, ErrorsNameTheFile) {
  const fs::path bin = dir_ / "cifar-10-batches-bin";
  for (int b = 1; b <= 5; ++b)
    write_bytes(bin / ("data_batch_" + std::to_string(b) + ".bin"), cifar_records(1, {0}, 0));
  expect_error([&] { convert_cifar(bin, dir_ / "out", 10, {}); }, {(bin / "test_batch.bin").string(), "not found"});
  std::vector<uint8_t> short_file = cifar_records(2, {0}, 0);
  short_file.pop_back();
  write_bytes(bin / "test_batch.bin", short_file);
  expect_error([&] { convert_cifar(bin, dir_ / "out", 10, {}); }, {(bin / "test_batch.bin").string(), "3073-byte"});
  write_bytes(bin / "test_batch.bin", cifar_records(1, {0}, 10));
  expect_error([&] { convert_cifar(bin, dir_ / "out", 10, {}); }, {(bin / "test_batch.bin").string(), "label 10"});
  expect_error([&] { convert_cifar(dir_ / "empty", dir_ / "out", 10, {}); }, {(dir_ / "empty").string()});
  fs::create_directories(dir_ / "empty");
  expect_error([&] { convert_cifar(dir_ / "empty", dir_ / "out", 10, {}); },
               {(dir_ / "empty" / "data_batch_1.bin").string(), "not found"});
  std::ofstream(bin / "batches.meta.txt") << "a\nb\n";
  write_bytes(bin / "test_batch.bin", cifar_records(1, {0}, 0));
  expect_error([&] { convert_cifar(bin, dir_ / "out", 10, {}); }, {(bin / "batches.meta.txt").string(), "2 names"});
}

// --------------------------------------------------------------------------------------- imagefolder

class ConverterImageFolder : public ConverterTest {
 protected:
  // train/cat: a gray PNG 20x30 (value 60) and an RGB PNG 40x24 (60, 60, 60);
  // train/dog: a JPEG 24x24 (200, 20, 20) and a PNG RGBA 16x32 (200, 20, 20, 9); val/cat, val/dog one each;
  // plus a stray notes.txt.
  void make_tree(const fs::path& root) {
    write_png(root / "train" / "cat" / "a.png", solid(20, 30, {60}), 20, 30, 1);
    write_png(root / "train" / "cat" / "sub" / "b.PNG", solid(40, 24, {60, 60, 60}), 40, 24, 3);
    write_jpeg(root / "train" / "dog" / "c.jpg", solid(24, 24, {200, 20, 20}), 24, 24, 3);
    write_png(root / "train" / "dog" / "d.png", solid(16, 32, {200, 20, 20, 9}), 16, 32, 4);
    write_bytes(root / "train" / "dog" / "notes.txt", {'h', 'i'});
    write_jpeg(root / "val" / "cat" / "e.jpeg", solid(30, 30, {60}), 30, 30, 1);
    write_png(root / "val" / "dog" / "f.png", solid(10, 12, {200, 20, 20}), 10, 12, 3);
  }
  static void write_png(const fs::path& path, const std::vector<uint8_t>& pixels, int64_t h, int64_t w, int64_t c) {
    write_bytes(path, encode_png(pixels.data(), h, w, c));
  }
  static void write_jpeg(const fs::path& path, const std::vector<uint8_t>& pixels, int64_t h, int64_t w, int64_t c) {
    write_bytes(path, encode_jpeg(pixels.data(), h, w, c, 95));
  }
  // Every record is a solid color that says its class: cat (60, 60, 60), dog (200, 20, 20).
  static void expect_class_colors(const ShardDataset& dataset, int tolerance) {
    ReadBack r = read_all(dataset);
    const int64_t n = dataset.info().height * dataset.info().width;
    for (int64_t i = 0; i < dataset.size(); ++i) {
      const int32_t label = r.labels[static_cast<size_t>(i)];
      ASSERT_TRUE(label == 0 || label == 1) << label;
      const std::vector<int> expected = label == 0 ? std::vector<int>{60, 60, 60} : std::vector<int>{200, 20, 20};
      for (int64_t p = 0; p < n; p += 7)
        for (int c = 0; c < 3; ++c)
          ASSERT_NEAR(r.images[static_cast<size_t>((i * n + p) * 3 + c)], expected[static_cast<size_t>(c)], tolerance)
              << "record " << i << " label " << label << " pixel " << p;
    }
  }
};

TEST_F(ConverterImageFolder, TrainAndValSplitsWithClassMapping) {
  make_tree(dir_ / "src");
  ImageFolderOptions image_options;
  image_options.size = 16;
  ConvertResult result = convert_imagefolder(dir_ / "src", dir_ / "out", image_options, {});
  ASSERT_EQ(result.splits.size(), 2u);
  EXPECT_EQ(result.splits[0].split, "train");
  EXPECT_EQ(result.splits[1].split, "val");
  ASSERT_EQ(result.notes.size(), 1u);
  EXPECT_NE(result.notes[0].find("notes.txt"), std::string::npos) << result.notes[0];

  ShardDataset train = ShardDataset::open(dir_ / "out", "train");
  EXPECT_EQ(train.size(), 4);
  EXPECT_FALSE(train.info().encoded);
  EXPECT_EQ(train.info().height, 16);
  EXPECT_EQ(train.info().width, 16);
  EXPECT_EQ(train.info().channels, 3);
  EXPECT_EQ(train.info().classes, (std::vector<std::string>{"cat", "dog"}));
  expect_class_colors(train, 3);
  ReadBack r = read_all(train);
  EXPECT_EQ(std::count(r.labels.begin(), r.labels.end(), 0), 2);
  ShardDataset val = ShardDataset::open(dir_ / "out", "val");
  EXPECT_EQ(val.size(), 2);
  expect_class_colors(val, 3);
}

TEST_F(ConverterImageFolder, KeepEncodedRoundTripsThroughReader) {
  make_tree(dir_ / "src");
  ImageFolderOptions image_options;
  image_options.size = 16;
  image_options.storage = ImageStorage::kJpeg;
  convert_imagefolder(dir_ / "src", dir_ / "out", image_options, {});
  ShardDataset train = ShardDataset::open(dir_ / "out", "train");
  EXPECT_TRUE(train.info().encoded);
  EXPECT_EQ(train.info().height, 16);
  EXPECT_EQ(train.info().channels, 3);
  expect_class_colors(train, 6);
  int32_t label = -1;
  std::vector<uint8_t> bytes = train.read_encoded(0, &label);
  EXPECT_EQ(detect_image_format(bytes.data(), bytes.size()), ImageFormat::kJpeg);
  // Mean of the split from the channel sums: two cat and two dog images.
  ASSERT_EQ(train.info().mean.size(), 3u);
  EXPECT_NEAR(train.info().mean[0], (60.0 + 200.0) / 2 / 255, 0.02);
  EXPECT_NEAR(train.info().mean[1], (60.0 + 20.0) / 2 / 255, 0.02);
}

TEST_F(ConverterImageFolder, SizeZeroKeepsEveryImageAsItIs) {
  make_tree(dir_ / "src");
  ImageFolderOptions image_options;
  image_options.size = 0;
  image_options.storage = ImageStorage::kJpeg;
  convert_imagefolder(dir_ / "src", dir_ / "out", image_options, {});
  ShardDataset train = ShardDataset::open(dir_ / "out", "train");
  ASSERT_TRUE(train.info().varied_size());
  EXPECT_EQ(train.info().channels, 3);
  // Each record keeps its own size; an RGB file keeps its own bytes, the gray PNG (1 channel in a
  // 3-channel split) is re-encoded as an RGB JPEG.
  std::map<std::pair<int64_t, int64_t>, fs::path> by_size = {{{20, 30}, "train/cat/a.png"},
                                                             {{40, 24}, "train/cat/sub/b.PNG"},
                                                             {{24, 24}, "train/dog/c.jpg"},
                                                             {{16, 32}, "train/dog/d.png"}};
  for (int64_t i = 0; i < train.size(); ++i) {
    const auto shape = train.record_shape(i);
    EXPECT_EQ(shape[2], 3);
    auto found = by_size.find({shape[0], shape[1]});
    ASSERT_NE(found, by_size.end()) << shape[0] << "x" << shape[1];
    const std::vector<uint8_t> bytes = train.read_encoded(i, nullptr);
    const DecodedImage image = decode_image(bytes.data(), bytes.size());
    EXPECT_EQ(image.height, shape[0]);
    EXPECT_EQ(image.width, shape[1]);
    EXPECT_EQ(image.channels, 3);
    if (found->second.filename() == "a.png")
      EXPECT_EQ(detect_image_format(bytes.data(), bytes.size()), ImageFormat::kJpeg);
    else
      EXPECT_TRUE(bytes == read_bytes(dir_ / "src" / found->second)) << found->second;
    by_size.erase(found);
  }
  // The mean weighs every pixel once: cat pixels (60) 600 + 960, dog pixels (200, 20, 20) 576 + 512.
  const double cat = 600 + 960, dog = 576 + 512;
  EXPECT_NEAR(train.info().mean[0], (60 * cat + 200 * dog) / (cat + dog) / 255, 0.01);
  expect_error(
      [&] {
        ImageFolderOptions raw;
        raw.size = 0;
        convert_imagefolder(dir_ / "src", dir_ / "raw", raw, {});
      },
      {"image size 0", "--encode jpeg"});
}

TEST_F(ConverterImageFolder, SingleSplitLayoutAndGrayscaleOutput) {
  const fs::path src = dir_ / "src";
  write_bytes(src / "b_class" / "x.png", encode_png(solid(8, 8, {90, 90, 90}).data(), 8, 8, 3));
  write_bytes(src / "a_class" / "y.jpg", encode_jpeg(solid(8, 12, {30}).data(), 8, 12, 1, 95));
  ImageFolderOptions image_options;
  image_options.size = 4;
  image_options.channels = 1;
  ConvertResult result = convert_imagefolder(src, dir_ / "out", image_options, {});
  ASSERT_EQ(result.splits.size(), 1u);
  ShardDataset train = ShardDataset::open(dir_ / "out", "train");
  EXPECT_EQ(train.info().classes, (std::vector<std::string>{"a_class", "b_class"}));
  EXPECT_EQ(train.info().channels, 1);
  ReadBack r = read_all(train);
  for (int64_t i = 0; i < 2; ++i)
    EXPECT_NEAR(r.images[static_cast<size_t>(i * 16 + 5)], r.labels[static_cast<size_t>(i)] == 0 ? 30 : 90, 2);
}

TEST_F(ConverterImageFolder, ShuffleMixesClassesAcrossShardsDeterministically) {
  const fs::path src = dir_ / "src";
  for (int i = 0; i < 12; ++i) {
    write_bytes(src / "a" / (std::to_string(i) + ".png"), encode_png(solid(4, 4, {10}).data(), 4, 4, 1));
    write_bytes(src / "b" / (std::to_string(i) + ".png"), encode_png(solid(4, 4, {240}).data(), 4, 4, 1));
  }
  ImageFolderOptions image_options;
  image_options.size = 4;
  ConvertOptions options;
  options.num_shards = 2;
  options.seed = 7;
  convert_imagefolder(src, dir_ / "out1", image_options, options);
  convert_imagefolder(src, dir_ / "out2", image_options, options);
  ReadBack first = read_all(ShardDataset::open(dir_ / "out1", "train"));
  ReadBack second = read_all(ShardDataset::open(dir_ / "out2", "train"));
  EXPECT_EQ(first.labels, second.labels);
  for (int shard = 0; shard < 2; ++shard) {
    std::set<int32_t> seen(first.labels.begin() + shard * 12, first.labels.begin() + (shard + 1) * 12);
    EXPECT_EQ(seen.size(), 2u) << "shard " << shard << " holds one class";
  }
  options.seed = 8;
  convert_imagefolder(src, dir_ / "out3", image_options, options);
  EXPECT_NE(read_all(ShardDataset::open(dir_ / "out3", "train")).labels, first.labels);

  const std::vector<int64_t> order = shuffled_order(1000, 3, 0);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
}

TEST_F(ConverterImageFolder, CorruptImageErrorNamesTheFile) {
  make_tree(dir_ / "src");
  std::vector<uint8_t> bytes = read_bytes(dir_ / "src" / "train" / "dog" / "c.jpg");
  bytes.resize(bytes.size() / 2);
  write_bytes(dir_ / "src" / "train" / "dog" / "c.jpg", bytes);
  ImageFolderOptions image_options;
  image_options.size = 8;
  expect_error([&] { convert_imagefolder(dir_ / "src", dir_ / "out", image_options, {}); },
               {(dir_ / "src" / "train" / "dog" / "c.jpg").string(), "corrupt JPEG"});
  write_bytes(dir_ / "src" / "train" / "dog" / "c.jpg", {'n', 'o', 'p', 'e'});
  expect_error([&] { convert_imagefolder(dir_ / "src", dir_ / "out", image_options, {}); },
               {(dir_ / "src" / "train" / "dog" / "c.jpg").string(), "not a JPEG or PNG"});
}

TEST_F(ConverterImageFolder, LayoutErrorsNameTheFolder) {
  make_tree(dir_ / "src");
  write_bytes(dir_ / "src" / "val" / "bird" / "g.png", encode_png(solid(4, 4, {1}).data(), 4, 4, 1));
  ImageFolderOptions image_options;
  image_options.size = 8;
  expect_error([&] { convert_imagefolder(dir_ / "src", dir_ / "out", image_options, {}); },
               {(dir_ / "src" / "val" / "bird").string(), "not one of the 2 classes"});
  fs::remove_all(dir_ / "src" / "val" / "bird");
  fs::create_directories(dir_ / "src" / "train" / "emu");
  expect_error([&] { convert_imagefolder(dir_ / "src", dir_ / "out", image_options, {}); },
               {(dir_ / "src" / "train" / "emu").string(), "no .jpg"});
  ConvertOptions too_many;
  too_many.num_shards = 50;
  fs::remove_all(dir_ / "src" / "train" / "emu");
  expect_error([&] { convert_imagefolder(dir_ / "src", dir_ / "out", image_options, too_many); },
               {"--shards 50 is more than the 4 records", "4 records"});
}

// ----------------------------------------------------------------------------------------- synthetic

using ConverterSynthetic = ConverterTest;

TEST_F(ConverterSynthetic, WritesLearnableDeterministicSplits) {
  SyntheticSpec spec;
  spec.height = 6;
  spec.width = 5;
  spec.channels = 3;
  spec.count = 200;
  spec.num_classes = 4;
  ConvertOptions options;
  options.num_shards = 3;
  options.seed = 11;
  ConvertResult result = convert_synthetic(dir_ / "a", spec, options);
  ASSERT_EQ(result.splits.size(), 2u);
  ShardDataset train = ShardDataset::open(dir_ / "a", "train"), test = ShardDataset::open(dir_ / "a", "test");
  EXPECT_EQ(train.size(), 200);
  EXPECT_EQ(train.info().shards.size(), 3u);
  EXPECT_EQ(test.size(), 40);
  EXPECT_EQ(test.info().shards.size(), 1u);
  EXPECT_EQ(train.info().num_classes, 4);
  EXPECT_EQ(train.info().channels, 3);
  ReadBack tr = read_all(train), te = read_all(test);
  std::set<int32_t> labels(tr.labels.begin(), tr.labels.end());
  EXPECT_EQ(labels, (std::set<int32_t>{0, 1, 2, 3}));

  // Nearest class mean (from train) classifies test almost perfectly: the labels are learnable.
  const int64_t d = 90;
  std::vector<double> means(4 * d, 0.0), counts(4, 0.0);
  for (int64_t i = 0; i < 200; ++i) {
    const int32_t l = tr.labels[static_cast<size_t>(i)];
    counts[static_cast<size_t>(l)] += 1;
    for (int64_t k = 0; k < d; ++k) means[static_cast<size_t>(l * d + k)] += tr.images[static_cast<size_t>(i * d + k)];
  }
  for (int64_t l = 0; l < 4; ++l)
    for (int64_t k = 0; k < d; ++k) means[static_cast<size_t>(l * d + k)] /= counts[static_cast<size_t>(l)];
  int correct = 0;
  for (int64_t i = 0; i < 40; ++i) {
    int best = 0;
    double best_distance = 1e300;
    for (int l = 0; l < 4; ++l) {
      double distance = 0;
      for (int64_t k = 0; k < d; ++k) {
        const double diff = te.images[static_cast<size_t>(i * d + k)] - means[static_cast<size_t>(l * d + k)];
        distance += diff * diff;
      }
      if (distance < best_distance) best_distance = distance, best = l;
    }
    correct += best == te.labels[static_cast<size_t>(i)];
  }
  EXPECT_GE(correct, 38);

  convert_synthetic(dir_ / "b", spec, options);
  EXPECT_EQ(read_all(ShardDataset::open(dir_ / "b", "train")).images, tr.images);
  options.seed = 12;
  convert_synthetic(dir_ / "c", spec, options);
  EXPECT_NE(read_all(ShardDataset::open(dir_ / "c", "train")).images, tr.images);
}

TEST_F(ConverterSynthetic, EncodesJpegRecordsNearTheRawOnes) {
  SyntheticSpec spec;
  spec.height = 32;
  spec.width = 24;
  spec.channels = 1;  // grayscale: no chroma subsampling, so JPEG keeps most of the noise
  spec.count = 30;
  spec.num_classes = 3;
  ConvertOptions options;
  options.num_shards = 2;
  options.seed = 5;
  convert_synthetic(dir_ / "raw", spec, options);
  spec.storage = ImageStorage::kJpeg;
  spec.jpeg_quality = 95;
  convert_synthetic(dir_ / "jpg", spec, options);
  ShardDataset raw = ShardDataset::open(dir_ / "raw", "train"), jpg = ShardDataset::open(dir_ / "jpg", "train");
  EXPECT_FALSE(raw.info().encoded);
  EXPECT_TRUE(jpg.info().encoded);
  EXPECT_EQ(jpg.direct_shards(), 2) << "version 2 encoded shards are read with pread";
  EXPECT_NEAR(jpg.info().mean[0], raw.info().mean[0], 1e-6) << "statistics of the pixels before encoding";
  ReadBack a = read_all(raw), b = read_all(jpg);
  EXPECT_EQ(a.labels, b.labels);
  ASSERT_EQ(a.images.size(), b.images.size());
  // Each record stays far nearer its own source than another record's.
  const size_t record = 32 * 24;
  double own = 0, other = 0;
  for (size_t i = 0; i + record < a.images.size(); ++i) {
    own += std::abs(double(a.images[i]) - double(b.images[i]));
    other += std::abs(double(a.images[i + record]) - double(b.images[i]));
  }
  EXPECT_LT(own, 0.3 * other) << "mean error " << own / double(a.images.size() - record) << " against "
                              << other / double(a.images.size() - record) << " for another record";
  spec.channels = 2;
  EXPECT_THROW(convert_synthetic(dir_ / "two", spec, options), Error);
}

TEST(ConverterShards, SmallerSplitsGetProportionallyFewerShards) {
  EXPECT_EQ(shards_for_split(4, 60000, 60000), 4);
  EXPECT_EQ(shards_for_split(4, 10000, 60000), 1);
  EXPECT_EQ(shards_for_split(1024, 50000, 1281167), 40);
  EXPECT_EQ(shards_for_split(8, 3, 100), 1);
  EXPECT_EQ(shards_for_split(8, 3, 3), 3);
}

// ----------------------------------------------------------------------------------- Fashion-MNIST

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

using ConverterFashionMnist = ConverterTest;

TEST_F(ConverterFashionMnist, RealFilesConvertAndReadBack) {
  if (!fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte.gz") &&
      !fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte"))
    GTEST_SKIP() << "Fashion-MNIST not installed in " << kFashionMnistDir << " (Debian: dataset-fashion-mnist)";
  ConvertOptions options;
  options.num_shards = 4;
  ConvertResult result = convert_idx(kFashionMnistDir, dir_, "fashion-mnist", options);
  ASSERT_EQ(result.splits.size(), 2u);

  ShardDataset train = ShardDataset::open(dir_, "train"), test = ShardDataset::open(dir_, "test");
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.info().shards.size(), 4u);
  EXPECT_EQ(train.info().classes.front(), "T-shirt/top");
  EXPECT_EQ(train.info().classes.back(), "Ankle boot");
  ASSERT_EQ(train.info().mean.size(), 1u);
  EXPECT_NEAR(train.info().mean[0], 0.2860, 0.001);
  EXPECT_NEAR(train.info().std[0], 0.3530, 0.001);

  const IdxImages idx = read_idx_images(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte");
  const IdxLabels idx_labels = read_idx_labels(fs::path(kFashionMnistDir) / "train-labels-idx1-ubyte");
  for (const ShardDataset* split : {&train, &test}) {
    ReadBack r = read_all(*split);
    for (int32_t label : r.labels) ASSERT_TRUE(label >= 0 && label < 10) << label;
    if (split == &train) {
      EXPECT_TRUE(std::equal(r.images.begin(), r.images.begin() + 784, idx.pixels.begin()));
      EXPECT_TRUE(std::equal(r.images.end() - 784, r.images.end(), idx.pixels.end() - 784));
      EXPECT_EQ(r.labels.front(), idx_labels.labels.front());
      EXPECT_EQ(r.labels.back(), idx_labels.labels.back());
    }
  }
}

// -------------------------------------------------------------------------------------------- segmentation

std::vector<uint8_t> read_masks(const ShardDataset& dataset) {
  std::vector<int64_t> all(static_cast<size_t>(dataset.size()));
  std::iota(all.begin(), all.end(), 0);
  std::vector<uint8_t> masks(static_cast<size_t>(dataset.size() * dataset.info().mask_bytes()));
  dataset.read_masks(all, masks.data());
  return masks;
}

TEST_F(ConverterCodec, MasksKeepTheirClassesFromGrayAndPalettePngs) {
  // Grayscale: the samples are the classes.
  const std::vector<uint8_t> gray = {0, 1, 2, 255, 7, 0};
  DecodedImage m = decode_mask(encode_png(gray.data(), 2, 3, 1).data(), encode_png(gray.data(), 2, 3, 1).size());
  EXPECT_EQ(m.channels, 1);
  EXPECT_EQ(m.height, 2);
  EXPECT_EQ(m.width, 3);
  EXPECT_EQ(m.pixels, gray);
  // Palette (VOC's masks): the indices, not the colours; at 4 bits a pixel too.
  const std::vector<uint8_t> palette = {0, 0, 0, 128, 0, 0, 0, 128, 0};
  const std::vector<uint8_t> eight = handmade_png(3, 1, 8, 3, {{2, 0, 1}}, palette);
  EXPECT_EQ(decode_mask(eight.data(), eight.size()).pixels, (std::vector<uint8_t>{2, 0, 1}));
  const std::vector<uint8_t> four = handmade_png(3, 2, 4, 3, {{0x12, 0x00}, {0x01, 0x20}}, palette);
  EXPECT_EQ(decode_mask(four.data(), four.size()).pixels, (std::vector<uint8_t>{1, 2, 0, 0, 1, 2}));
  // Colours are no classes; a JPEG's compression would change them.
  const std::vector<uint8_t> rgb = solid(2, 2, {1, 2, 3});
  const std::vector<uint8_t> rgb_png = encode_png(rgb.data(), 2, 2, 3);
  expect_error([&] { decode_mask(rgb_png.data(), rgb_png.size()); }, {"one channel of classes", "got 3 channels"});
  const std::vector<uint8_t> jpeg = encode_jpeg(gray.data(), 2, 3, 1, 95);
  expect_error([&] { decode_mask(jpeg.data(), jpeg.size()); }, {"must be a PNG"});
}

class ConverterSegmentation : public ConverterTest {
 protected:
  // An image whose every pixel says its record (channel 0 = tag), and a mask of classes: column x holds
  // (x + tag) % classes, row 0 ignored (255).
  static void write_pair(const fs::path& root, const std::string& name, int tag, int64_t h, int64_t w, int classes,
                         bool palette_mask = false) {
    std::vector<uint8_t> image = solid(h, w, {static_cast<uint8_t>(tag), 50, 100});
    write_bytes(root / "images" / (name + ".png"), encode_png(image.data(), h, w, 3));
    std::vector<std::vector<uint8_t>> rows;
    std::vector<uint8_t> mask;
    for (int64_t y = 0; y < h; ++y) {
      rows.emplace_back();
      for (int64_t x = 0; x < w; ++x) {
        const uint8_t v = y == 0 ? 255 : static_cast<uint8_t>((x + tag) % classes);
        rows.back().push_back(v);
        mask.push_back(v);
      }
    }
    if (palette_mask) {
      std::vector<uint8_t> colours(256 * 3);
      for (size_t i = 0; i < colours.size(); ++i) colours[i] = static_cast<uint8_t>(i * 37);
      write_bytes(root / "masks" / (name + ".png"),
                  handmade_png(static_cast<uint32_t>(w), static_cast<uint32_t>(h), 8, 3, rows, colours));
    } else {
      write_bytes(root / "masks" / (name + ".png"), encode_png(mask.data(), h, w, 1));
    }
  }
  // Every record's mask is the pattern of the tag its image carries.
  static void expect_pairs_kept(const ShardDataset& dataset, int classes, int64_t size) {
    const ReadBack r = read_all(dataset);
    const std::vector<uint8_t> masks = read_masks(dataset);
    for (int64_t i = 0; i < dataset.size(); ++i) {
      const int tag = r.images[static_cast<size_t>(i * size * size * 3)];
      for (int64_t y = 0; y < size; ++y)
        for (int64_t x = 0; x < size; ++x)
          ASSERT_EQ(masks[static_cast<size_t>((i * size + y) * size + x)],
                    y == 0 ? 255 : static_cast<uint8_t>((x + tag) % classes))
              << "record " << i << " (tag " << tag << ") pixel " << y << "," << x;
    }
  }
};

TEST_F(ConverterSegmentation, FolderOfImagesAndMasksInSplits) {
  const std::vector<std::string> names = {"t0", "t1", "t2", "t3", "t4", "t5"};
  for (int k = 0; k < 6; ++k) write_pair(dir_ / "src" / "train", names[static_cast<size_t>(k)], k, 5, 5, 4, k % 2);
  write_pair(dir_ / "src" / "val", "v0", 10, 5, 5, 4);
  write_pair(dir_ / "src" / "val", "v1", 11, 5, 5, 4);
  write_bytes(dir_ / "src" / "train" / "images" / "README.txt", {'x'});
  ConvertOptions options;
  options.num_shards = 2;
  ConvertResult result = convert_segmentation_folder(dir_ / "src", dir_ / "out", {}, options);
  ASSERT_EQ(result.splits.size(), 2u);
  EXPECT_EQ(result.splits[1].split, "val");
  ASSERT_EQ(result.notes.size(), 1u);
  EXPECT_NE(result.notes[0].find("skipped 1 files"), std::string::npos) << result.notes[0];
  ShardDataset train = ShardDataset::open(dir_ / "out", "train");
  EXPECT_TRUE(train.info().segmentation);
  EXPECT_EQ(train.info().num_classes, 4) << "one more than the largest class of the train masks";
  EXPECT_EQ(train.size(), 6);
  EXPECT_EQ(train.info().shards.size(), 2u);
  expect_pairs_kept(train, 4, 5);
  expect_pairs_kept(ShardDataset::open(dir_ / "out", "val"), 4, 5);
  // Shuffled, deterministically.
  const std::vector<uint8_t> first = read_all(train).images;
  std::set<int> tags;
  for (int64_t i = 0; i < 6; ++i) tags.insert(first[static_cast<size_t>(i * 75)]);
  EXPECT_EQ(tags.size(), 6u);
  convert_segmentation_folder(dir_ / "src", dir_ / "again", {}, options);
  EXPECT_EQ(read_all(ShardDataset::open(dir_ / "again", "train")).images, first);
}

TEST_F(ConverterSegmentation, SizeResizesMasksByTheNearestPixelWithTheirImages) {
  // 8 x 4 images: the shorter side is already 4, so --size 4 keeps the central rows 2..5 (no scaling): each mask
  // row y of the output is the source's row y + 2, the pattern by column unchanged.
  for (const int k : {0, 1, 2}) write_pair(dir_ / "src", std::string(1, static_cast<char>('a' + k)), k, 8, 4, 3);
  SegmentationFolderOptions segmentation;
  segmentation.size = 4;
  segmentation.num_classes = 5;
  convert_segmentation_folder(dir_ / "src", dir_ / "out", segmentation, {});
  ShardDataset train = ShardDataset::open(dir_ / "out", "train");
  EXPECT_EQ(train.info().height, 4);
  EXPECT_EQ(train.info().num_classes, 5) << "--classes wins over the masks' count";
  const ReadBack r = read_all(train);
  const std::vector<uint8_t> masks = read_masks(train);
  for (int64_t i = 0; i < 3; ++i) {
    const int tag = r.images[static_cast<size_t>(i * 48)];
    for (int64_t y = 0; y < 4; ++y)
      for (int64_t x = 0; x < 4; ++x)
        EXPECT_EQ(masks[static_cast<size_t>(i * 16 + y * 4 + x)], (x + tag) % 3) << i << ": " << y << "," << x;
  }
  // Upscaled 2x: each source pixel becomes a 2x2 block.
  fs::remove_all(dir_ / "src");
  write_pair(dir_ / "src", "up", 1, 3, 3, 3);
  segmentation.size = 6;
  convert_segmentation_folder(dir_ / "src", dir_ / "up", segmentation, {});
  const std::vector<uint8_t> up = read_masks(ShardDataset::open(dir_ / "up", "train"));
  for (int64_t y = 0; y < 6; ++y)
    for (int64_t x = 0; x < 6; ++x)
      EXPECT_EQ(up[static_cast<size_t>(y * 6 + x)], y / 2 == 0 ? 255 : (x / 2 + 1) % 3) << y << "," << x;
}

TEST_F(ConverterSegmentation, ErrorsNameTheFile) {
  const fs::path src = dir_ / "src";
  write_pair(src, "a", 0, 4, 4, 3);
  write_pair(src, "b", 1, 4, 4, 3);
  fs::remove(src / "masks" / "b.png");
  expect_error([&] { convert_segmentation_folder(src, dir_ / "o1", {}, {}); },
               {"images/b.png", "has no mask", "b.png"});
  write_pair(src, "b", 1, 4, 4, 3);
  fs::remove(src / "images" / "a.png");
  expect_error([&] { convert_segmentation_folder(src, dir_ / "o2", {}, {}); }, {"masks/a.png", "has no image"});
  write_pair(src, "a", 0, 4, 4, 3);
  // A mask of another size than its image.
  const std::vector<uint8_t> small(6, 1);
  write_bytes(src / "masks" / "a.png", encode_png(small.data(), 2, 3, 1));
  expect_error([&] { convert_segmentation_folder(src, dir_ / "o3", {}, {}); },
               {"masks/a.png", "is 2x3 but its image", "4x4"});
  // An RGB mask.
  const std::vector<uint8_t> colour = solid(4, 4, {1, 2, 3});
  write_bytes(src / "masks" / "a.png", encode_png(colour.data(), 4, 4, 3));
  expect_error([&] { convert_segmentation_folder(src, dir_ / "o4", {}, {}); }, {"masks/a.png", "one channel"});
  write_pair(src, "a", 0, 4, 4, 3);
  // A class beyond --classes names the mask and the way out.
  SegmentationFolderOptions two;
  two.num_classes = 2;
  expect_error([&] { convert_segmentation_folder(src, dir_ / "o5", two, {}); },
               {"masks/", "class 2", "outside [0, 2)"});
  // Images of several sizes without --size.
  write_pair(src, "c", 2, 5, 4, 3);
  expect_error([&] { convert_segmentation_folder(src, dir_ / "o6", {}, {}); },
               {"is 5x4 but the first is 4x4", "--size"});
  // No images/ folder.
  expect_error([&] { convert_segmentation_folder(dir_ / "empty", dir_ / "o7", {}, {}); }, {"has no 'images' folder"});
}

TEST_F(ConverterSegmentation, SyntheticMasksAreLearnableAndDeterministic) {
  SyntheticSegmentationSpec spec;
  spec.size = 16;
  spec.count = 40;
  spec.num_classes = 4;
  ConvertOptions options;
  options.seed = 5;
  options.num_shards = 2;
  convert_synthetic_segmentation(dir_ / "a", spec, options);
  ShardDataset train = ShardDataset::open(dir_ / "a", "train"), test = ShardDataset::open(dir_ / "a", "test");
  EXPECT_EQ(train.size(), 40);
  EXPECT_EQ(test.size(), 8);
  EXPECT_TRUE(test.info().segmentation);
  const ReadBack r = read_all(train);
  const std::vector<uint8_t> masks = read_masks(train);
  // Every class is present; a pixel's colour says its class: the nearest class mean colour is right almost always.
  std::vector<double> sums(12, 0.0), counts(4, 0.0);
  for (size_t p = 0; p < masks.size(); ++p) {
    ASSERT_LT(masks[p], 4);
    counts[masks[p]] += 1;
    for (size_t c = 0; c < 3; ++c) sums[masks[p] * 3 + c] += r.images[p * 3 + c];
  }
  for (int k = 0; k < 4; ++k) ASSERT_GT(counts[static_cast<size_t>(k)], 0) << "class " << k << " never drawn";
  int64_t right = 0;
  for (size_t p = 0; p < masks.size(); ++p) {
    size_t best = 0;
    double best_distance = 1e300;
    for (size_t k = 0; k < 4; ++k) {
      double distance = 0;
      for (size_t c = 0; c < 3; ++c) {
        const double d = r.images[p * 3 + c] - sums[k * 3 + c] / counts[k];
        distance += d * d;
      }
      if (distance < best_distance) best_distance = distance, best = k;
    }
    right += best == masks[p];
  }
  EXPECT_GT(static_cast<double>(right) / static_cast<double>(masks.size()), 0.9);
  convert_synthetic_segmentation(dir_ / "b", spec, options);
  EXPECT_EQ(read_masks(ShardDataset::open(dir_ / "b", "train")), masks);
  options.seed = 6;
  convert_synthetic_segmentation(dir_ / "c", spec, options);
  EXPECT_NE(read_masks(ShardDataset::open(dir_ / "c", "train")), masks);
  spec.num_classes = 1;
  expect_error([&] { convert_synthetic_segmentation(dir_ / "d", spec, options); }, {"--classes must be from 2"});
}

}  // namespace
}  // namespace ringtrain::data
