// Tests for data/shards.h: writer -> reader round trip, manifest, and every validation error.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/codec.h"
#include "data/shards.h"
#include "io/hdf5.h"
#include "test_util.h"

namespace ringtrain::data {
namespace {
namespace fs = std::filesystem;

// A "train" split of `records` HxWxC images in `shards` files, `classes` classes, source "test".
WriterOptions split_options(const fs::path& dir, int shards, int64_t records, int64_t h, int64_t w, int64_t c,
                            int classes) {
  WriterOptions o;
  o.dir = dir;
  o.num_shards = shards;
  o.total_records = records;
  o.height = h;
  o.width = w;
  o.channels = c;
  o.num_classes = classes;
  o.source = "test";
  return o;
}

class Shards : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("rt_shards_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // 10 records of 4x3x2 with pixel value (record * 7 + byte) % 256 and label record % 3.
  SplitInfo write(const std::string& split = "train", int shards = 3, int64_t records = 10) {
    WriterOptions o = split_options(dir_, shards, records, 4, 3, 2, 3);
    o.split = split;
    ShardWriter w(o);
    std::vector<uint8_t> image(24);
    for (int64_t r = 0; r < records; ++r) {
      for (int64_t i = 0; i < 24; ++i) image[static_cast<size_t>(i)] = static_cast<uint8_t>((r * 7 + i) % 256);
      w.add(image.data(), static_cast<int32_t>(r % 3));
    }
    return w.finish();
  }

  std::string open_error(const std::string& split = "train") {
    try {
      ShardDataset::open(dir_, split);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  // Rewrites a dataset of a shard (and fixes the manifest checksum so only the intended fault remains).
  void tamper(const std::string& file, const std::function<void(hid_t)>& edit, bool fix_checksum = true) {
    {
      std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
      hid_t f = H5Fopen((dir_ / file).c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      ASSERT_GE(f, 0);
      edit(f);
      H5Fclose(f);
    }
    if (fix_checksum) {
      nlohmann::json m = nlohmann::json::parse(std::ifstream(dir_ / "manifest.json"));
      for (auto& [name, split] : m["splits"].items())
        for (auto& sh : split["shards"])
          if (sh["file"] == file) {
            char buf[16];
            std::snprintf(buf, sizeof buf, "%08x", file_crc32(dir_ / file));
            sh["crc32"] = buf;
          }
      std::ofstream(dir_ / "manifest.json") << m.dump(2);
    }
  }

  fs::path dir_;
};

TEST_F(Shards, RoundTripAcrossShardBoundaries) {
  SplitInfo info = write();
  EXPECT_EQ(info.shards.size(), 3u);
  EXPECT_EQ(info.shards[0].file, "train-00000-of-00003.h5");
  EXPECT_EQ(info.shards[0].records + info.shards[1].records + info.shards[2].records, 10);
  ShardDataset ds = ShardDataset::open(dir_, "train");
  EXPECT_EQ(ds.size(), 10);
  EXPECT_EQ(ds.info().record_bytes(), 24);
  std::vector<uint8_t> images(10 * 24);
  std::vector<int32_t> labels(10);
  ds.read_range(0, 10, images.data(), labels.data());
  for (int64_t r = 0; r < 10; ++r) {
    EXPECT_EQ(labels[static_cast<size_t>(r)], r % 3);
    for (int64_t i = 0; i < 24; ++i) ASSERT_EQ(images[static_cast<size_t>(r * 24 + i)], (r * 7 + i) % 256);
  }
  std::vector<int64_t> picks{9, 2, 3, 4, 0};
  std::vector<uint8_t> some(5 * 24);
  std::vector<int32_t> some_labels(5);
  ds.read_indices(picks, some.data(), some_labels.data());
  for (size_t k = 0; k < picks.size(); ++k) {
    EXPECT_EQ(some_labels[k], picks[k] % 3);
    EXPECT_EQ(some[k * 24], (picks[k] * 7) % 256);
  }
  EXPECT_EQ(ds.locate(3), std::make_pair(1, int64_t{0}));
  EXPECT_THROW(ds.locate(10), Error);
  EXPECT_THROW(ds.read_range(8, 3, images.data(), labels.data()), Error);
}

TEST_F(Shards, MeanStdAndManifestKeepOtherSplits) {
  SplitInfo train = write("train", 2, 10);
  write("test", 1, 4);
  auto splits = read_manifest(dir_);
  ASSERT_EQ(splits.size(), 2u);
  // Channel 0 holds even bytes i, channel 1 odd bytes; mean of (r*7 + i) % 256 / 255 per channel.
  double sum0 = 0;
  for (int r = 0; r < 10; ++r)
    for (int i = 0; i < 24; i += 2) sum0 += ((r * 7 + i) % 256) / 255.0;
  EXPECT_NEAR(train.mean[0], sum0 / 120, 1e-6);
  EXPECT_GT(train.std[0], 0.0f);
  EXPECT_EQ(ShardDataset::open(dir_, "test").size(), 4);
  EXPECT_EQ(ShardDataset::open(dir_, "train").size(), 10);
}

TEST_F(Shards, MoreShardsThanRecordsAndEmptySplit) {
  write("train", 4, 2);
  EXPECT_EQ(ShardDataset::open(dir_, "train").size(), 2);
  write("empty", 2, 0);
  // Training on (or evaluating) nothing is refused when the split is opened, naming it, unless allowed.
  const std::string e = testing::error_of([&] { ShardDataset::open(dir_, "empty"); });
  EXPECT_NE(e.find("split 'empty' has no records"), std::string::npos) << e;
  EXPECT_EQ(ShardDataset::open(dir_, "empty", {.allow_empty = true}).size(), 0);
}

TEST_F(Shards, WriterRejectsBadInputAndCleansUp) {
  WriterOptions o;
  o.dir = dir_;
  o.total_records = 2;
  o.height = o.width = o.channels = 1;
  o.num_classes = 2;
  {
    ShardWriter w(o);
    uint8_t px = 1;
    EXPECT_THROW(w.add(&px, 2), Error);  // label out of range
    w.add(&px, 1);
    EXPECT_THROW(w.finish(), Error);  // one record short
  }
  // The abandoned writer left no files behind.
  for (const auto& e : fs::directory_iterator(dir_)) ADD_FAILURE() << "left behind: " << e.path();
  o.num_shards = 0;
  EXPECT_THROW(ShardWriter{o}, Error);
}

TEST_F(Shards, MissingManifestFileAndSplit) {
  EXPECT_NE(open_error().find("does not exist"), std::string::npos);
  write();
  EXPECT_NE(open_error("val").find("has no split 'val'"), std::string::npos) << open_error("val");
  fs::remove(dir_ / "train-00001-of-00003.h5");
  std::string e = open_error();
  EXPECT_NE(e.find("train-00001-of-00003.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  fs::remove(dir_ / "manifest.json");
  EXPECT_NE(open_error().find("no manifest.json"), std::string::npos);
}

// 300 records of 64x64x3 in 2 shards: 85 records a chunk, so each shard has a full chunk and a partial one.
SplitInfo write_big(const fs::path& dir) {
  ShardWriter w(split_options(dir, 2, 300, 64, 64, 3, 5));
  std::vector<uint8_t> image(64 * 64 * 3);
  for (int64_t r = 0; r < 300; ++r) {
    for (size_t i = 0; i < image.size(); ++i)
      image[i] = static_cast<uint8_t>((r * 131 + static_cast<int64_t>(i) * 7) % 251);
    w.add(image.data(), static_cast<int32_t>(r % 5));
  }
  return w.finish();
}

// Every record of the split through pread and through HDF5, in order and in a scattered order.
void expect_direct_equals_hdf5(const fs::path& dir, int direct_shards) {
  ShardDataset direct = ShardDataset::open(dir, "train");
  ShardDataset::OpenOptions off;
  off.direct_reads = false;
  ShardDataset hdf5 = ShardDataset::open(dir, "train", off);
  EXPECT_EQ(direct.direct_shards(), direct_shards);
  EXPECT_EQ(hdf5.direct_shards(), 0);
  const int64_t n = direct.size(), rb = direct.info().record_bytes();
  std::vector<uint8_t> a(static_cast<size_t>(n * rb)), b(a.size());
  std::vector<int32_t> la(static_cast<size_t>(n)), lb(la.size());
  direct.read_range(0, n, a.data(), la.data());
  hdf5.read_range(0, n, b.data(), lb.data());
  EXPECT_TRUE(a == b) << "read_range";
  EXPECT_TRUE(la == lb);
  EXPECT_EQ(a[static_cast<size_t>(rb * 299 + 5)], static_cast<uint8_t>((299 * 131 + 5 * 7) % 251));
  std::vector<int64_t> order;
  for (int64_t i = 0; i < n; ++i) order.push_back((i * 97 + 13) % n);  // 97 is prime to 300: a permutation
  std::fill(a.begin(), a.end(), 0);
  std::fill(b.begin(), b.end(), 1);
  direct.read_indices(order, a.data(), la.data());
  hdf5.read_indices(order, b.data(), lb.data());
  EXPECT_TRUE(a == b) << "read_indices";
}

TEST_F(Shards, DirectReadsAreByteIdenticalToHdf5ReadsForEveryLayout) {
  write_big(dir_);
  expect_direct_equals_hdf5(dir_, 2);  // chunked, as make_shards writes
  // A contiguous /images (another writer's choice) is read directly too; a compressed one through HDF5.
  auto rewrite = [&](const std::string& file, bool deflate) {
    tamper(file, [&](hid_t f) {
      hid_t old = H5Dopen2(f, "images", H5P_DEFAULT);
      hid_t space = H5Dget_space(old);
      hsize_t dims[4];
      H5Sget_simple_extent_dims(space, dims, nullptr);
      std::vector<uint8_t> data(dims[0] * dims[1] * dims[2] * dims[3]);
      H5Dread(old, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
      H5Dclose(old);
      H5Ldelete(f, "images", H5P_DEFAULT);
      hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
      if (deflate) {
        hsize_t chunk[4] = {16, dims[1], dims[2], dims[3]};
        H5Pset_chunk(plist, 4, chunk);
        H5Pset_deflate(plist, 1);
      }
      hid_t ds = H5Dcreate2(f, "images", H5T_STD_U8LE, space, H5P_DEFAULT, plist, H5P_DEFAULT);
      H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
      H5Dclose(ds);
      H5Pclose(plist);
      H5Sclose(space);
    });
  };
  rewrite("train-00000-of-00002.h5", false);
  expect_direct_equals_hdf5(dir_, 2);
  rewrite("train-00001-of-00002.h5", true);
  expect_direct_equals_hdf5(dir_, 1);
}

TEST_F(Shards, AShardCutShortAfterOpeningIsAnErrorNamingFileAndRecord) {
  write_big(dir_);
  ShardDataset ds = ShardDataset::open(dir_, "train");
  const fs::path shard = dir_ / "train-00001-of-00002.h5";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  std::vector<uint8_t> out(static_cast<size_t>(ds.info().record_bytes() * 150));
  try {
    ds.read_range(150, 150, out.data(), nullptr);
    FAIL() << "read past the end of a truncated shard";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("train-00001-of-00002.h5"), std::string::npos) << w;
    EXPECT_NE(w.find("record"), std::string::npos) << w;
    EXPECT_NE(w.find("truncated"), std::string::npos) << w;
  }
}

// 20 PNGs of 256x256x3 noise (~190 KB each) in 2 shards: each shard's /encoded spans 3 chunks of 1 MiB,
// and some records straddle a chunk boundary. Returns every record's bytes.
std::vector<std::vector<uint8_t>> write_encoded(const fs::path& dir) {
  WriterOptions o = split_options(dir, 2, 20, 256, 256, 3, 4);
  o.encoded = true;
  ShardWriter w(o);
  std::vector<std::vector<uint8_t>> all;
  uint32_t x = 12345;
  std::vector<uint8_t> pixels(256 * 256 * 3);
  for (int r = 0; r < 20; ++r) {
    for (auto& p : pixels) p = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
    all.push_back(encode_png(pixels.data(), 256, 256, 3));
    const int64_t hwc[3] = {256, 256, 3};
    w.add_encoded(all.back(), hwc, r % 4, {1, 1, 1}, {1, 1, 1});
  }
  w.finish();
  return all;
}

TEST_F(Shards, EncodedRecordsReadWithPreadAreTheBytesWritten) {
  const auto written = write_encoded(dir_);
  ShardDataset direct = ShardDataset::open(dir_, "train");
  ShardDataset::OpenOptions off;
  off.direct_reads = false;
  ShardDataset hdf5 = ShardDataset::open(dir_, "train", off);
  EXPECT_EQ(direct.direct_shards(), 2);
  for (int64_t i = 0; i < 20; ++i) {
    int32_t la = -1, lb = -1;
    EXPECT_TRUE(direct.read_encoded(i, &la) == written[static_cast<size_t>(i)]) << "record " << i;
    EXPECT_TRUE(hdf5.read_encoded(i, &lb) == written[static_cast<size_t>(i)]) << "record " << i;
    EXPECT_EQ(la, i % 4);
    EXPECT_EQ(lb, la);
  }
  std::vector<uint8_t> a(static_cast<size_t>(20 * 256 * 256 * 3)), b(a.size());
  direct.read_range(0, 20, a.data(), nullptr);
  const DecodedImage first = decode_image(written[0].data(), written[0].size());
  EXPECT_TRUE(std::equal(first.pixels.begin(), first.pixels.end(), a.begin())) << "decoded through read_range";
}

TEST_F(Shards, AVersion1EncodedShardIsStillRead) {
  const auto written = write_encoded(dir_);
  // Shard 0 back to the version 1 layout: one variable-length /jpeg dataset.
  tamper("train-00000-of-00002.h5", [&](hid_t f) {
    H5Ldelete(f, "encoded", H5P_DEFAULT);
    H5Ldelete(f, "offsets", H5P_DEFAULT);
    hsize_t dims[1] = {10};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t vlen = H5Tvlen_create(H5T_STD_U8LE);
    hid_t ds = H5Dcreate2(f, "jpeg", vlen, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<hvl_t> values;
    for (int i = 0; i < 10; ++i)
      values.push_back(
          {written[static_cast<size_t>(i)].size(), const_cast<uint8_t*>(written[static_cast<size_t>(i)].data())});
    H5Dwrite(ds, vlen, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Dclose(ds);
    H5Tclose(vlen);
    H5Sclose(space);
    H5Adelete(f, "format_version");
    h5::write_int_attribute(f, "format_version", {1}, h5::Where{"shard", "train-00000-of-00002.h5", ""});
  });
  ShardDataset ds = ShardDataset::open(dir_, "train");
  EXPECT_EQ(ds.direct_shards(), 1) << "the version 1 shard goes through HDF5";
  for (int64_t i = 0; i < 20; ++i) EXPECT_TRUE(ds.read_encoded(i, nullptr) == written[static_cast<size_t>(i)]) << i;
}

TEST_F(Shards, CorruptEncodedOffsetsAreRefusedNamingFileAndRecord) {
  write_encoded(dir_);
  auto set_offset = [&](size_t at, int64_t value) {
    tamper("train-00001-of-00002.h5", [&](hid_t f) {
      hid_t ds = H5Dopen2(f, "offsets", H5P_DEFAULT);
      std::vector<int64_t> o(11);
      H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, o.data());
      o[at] = value < 0 ? o[at - 1] : value;
      H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, o.data());
      H5Dclose(ds);
    });
  };
  set_offset(3, -1);  // record 2 empty
  std::string e = open_error();
  EXPECT_NE(e.find("train-00001-of-00002.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("'/encoded' record 2 would be bytes"), std::string::npos) << e;
  write_encoded(dir_);
  set_offset(10, int64_t{1} << 40);  // the last record past the end of /encoded
  e = open_error();
  EXPECT_NE(e.find("'/encoded' record 9 would be bytes"), std::string::npos) << e;
}

// A "train" split of JPEGs that keep their own sizes: record r is (30 + 7r) x (40 + 5r) x 3, 2 shards.
std::vector<std::vector<uint8_t>> write_varied(const fs::path& dir, int64_t records = 8) {
  WriterOptions o = split_options(dir, 2, records, 0, 0, 3, 4);
  o.encoded = true;
  ShardWriter w(o);
  std::vector<std::vector<uint8_t>> all;
  for (int64_t r = 0; r < records; ++r) {
    const int64_t hwc[3] = {30 + 7 * r, 40 + 5 * r, 3};
    std::vector<uint8_t> pixels(static_cast<size_t>(hwc[0] * hwc[1] * 3), static_cast<uint8_t>(50 + r));
    all.push_back(encode_jpeg(pixels.data(), hwc[0], hwc[1], 3, 90));
    const double n = static_cast<double>(hwc[0] * hwc[1]);
    w.add_encoded(all.back(), hwc, static_cast<int32_t>(r % 4), {n * 0.5, n * 0.5, n * 0.5},
                  {n * 0.25, n * 0.25, n * 0.25});
  }
  w.finish();
  return all;
}

TEST_F(Shards, ASplitOfVariedSizesKeepsEachRecordsShapeAsVersion3) {
  const auto written = write_varied(dir_);
  ShardDataset ds = ShardDataset::open(dir_, "train");
  EXPECT_TRUE(ds.info().varied_size());
  EXPECT_EQ(ds.info().shape_text(), "varied x 3");
  EXPECT_EQ(ds.chunk_records(), 1);
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(ds.record_shape(r), (std::array<int64_t, 3>{30 + 7 * r, 40 + 5 * r, 3})) << r;
    EXPECT_TRUE(ds.read_encoded(r, nullptr) == written[static_cast<size_t>(r)]) << r;
  }
  EXPECT_NE(ds.record_name(5).find("train-00001-of-00002.h5', '/encoded' record 1"), std::string::npos)
      << ds.record_name(5);
  // Mean from pixel-weighted sums (every record 0.5): records of different sizes weigh by their pixels.
  EXPECT_NEAR(ds.info().mean[0], 0.5, 1e-6);
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(dir_ / "manifest.json"));
  EXPECT_EQ(m["format_version"], 3);
  EXPECT_EQ(m["splits"]["train"]["image_shape"], nlohmann::json::array({0, 0, 3}));
  {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    hid_t f = H5Fopen((dir_ / "train-00000-of-00002.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    EXPECT_EQ(h5::read_int_attribute(f, "format_version", h5::Where{"shard", "x", ""}), std::vector<int>{3});
    H5Fclose(f);
  }
  // No common shape to read into.
  std::vector<uint8_t> buffer(1 << 16);
  try {
    ds.read_range(0, 1, buffer.data(), nullptr);
    ADD_FAILURE() << "read_range on a split of varied sizes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("varied sizes"), std::string::npos) << e.what();
  }
}

TEST_F(Shards, FixedSizeSplitsAreStillWrittenAsVersion2) {
  write_encoded(dir_);
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(dir_ / "manifest.json"));
  EXPECT_EQ(m["format_version"], 2) << "a version 2 reader must keep reading datasets without varied sizes";
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  hid_t f = H5Fopen((dir_ / "train-00000-of-00002.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_EQ(h5::read_int_attribute(f, "format_version", h5::Where{"shard", "x", ""}), std::vector<int>{2});
  H5Fclose(f);
}

TEST_F(Shards, BadShapesOfAVariedSplitAreRefusedNamingFileAndRecord) {
  write_varied(dir_);
  tamper("train-00001-of-00002.h5", [&](hid_t f) {
    hid_t ds = H5Dopen2(f, "shapes", H5P_DEFAULT);
    std::vector<int32_t> s(12);
    H5Dread(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data());
    s[3 * 2 + 1] = 0;  // record 2: width 0
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data());
    H5Dclose(ds);
  });
  std::string e = open_error();
  EXPECT_NE(e.find("train-00001-of-00002.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("'/shapes' record 2 is"), std::string::npos) << e;
  write_varied(dir_);
  tamper("train-00000-of-00002.h5", [&](hid_t f) { H5Ldelete(f, "shapes", H5P_DEFAULT); });
  e = open_error();
  EXPECT_NE(e.find("missing dataset '/shapes'"), std::string::npos) << e;
  write_varied(dir_);
  tamper("train-00000-of-00002.h5", [&](hid_t f) {
    H5Adelete(f, "format_version");
    h5::write_int_attribute(f, "format_version", {2}, h5::Where{"shard", "x", ""});
  });
  e = open_error();
  EXPECT_NE(e.find("format_version 2 but the manifest says split 'train' holds images of varied sizes"),
            std::string::npos)
      << e;
}

TEST_F(Shards, WriterRefusesRecordsOfTheWrongChannelsInAVariedSplit) {
  WriterOptions o = split_options(dir_, 1, 1, 0, 0, 3, 2);
  o.encoded = true;
  ShardWriter w(o);
  const int64_t gray[3] = {10, 12, 1};
  try {
    w.add_encoded({1, 2, 3}, gray, 0, {0, 0, 0}, {0, 0, 0});
    ADD_FAILURE() << "a 1-channel record in a 3-channel split";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("decodes to 10x12x1, the split's images are of varied sizes"),
              std::string::npos)
        << e.what();
  }
  WriterOptions raw = split_options(dir_ / "raw", 1, 1, 0, 0, 3, 2);
  EXPECT_THROW(ShardWriter{raw}, Error) << "0x0 is only for encoded splits";
}

TEST_F(Shards, CorruptAndTruncatedFiles) {
  write();
  const fs::path shard = dir_ / "train-00002-of-00003.h5";
  {  // flip one byte: checksum catches it
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('\x5a');
  }
  std::string e = open_error();
  EXPECT_NE(e.find("train-00002-of-00003.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("corrupt"), std::string::npos) << e;
  // Truncated, with checksums off: HDF5's error is translated and names the file.
  fs::resize_file(shard, 100);
  try {
    ShardDataset::open(dir_, "train", {.verify_checksums = false, .check_labels = true});
    FAIL();
  } catch (const Error& err) {
    std::string w = err.what();
    EXPECT_NE(w.find("train-00002-of-00003.h5"), std::string::npos) << w;
    EXPECT_NE(w.find("truncated"), std::string::npos) << w;
  }
}

TEST_F(Shards, WrongDtypeRankAndMissingDataset) {
  write();
  tamper("train-00000-of-00003.h5", [](hid_t f) {
    H5Ldelete(f, "labels", H5P_DEFAULT);
    hsize_t dims[1] = {3};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t ds = H5Dcreate2(f, "labels", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(ds);
    H5Sclose(space);
  });
  std::string e = open_error();
  EXPECT_NE(e.find("'/labels' must be int32"), std::string::npos) << e;
  EXPECT_NE(e.find("train-00000-of-00003.h5"), std::string::npos) << e;

  write();
  tamper("train-00001-of-00003.h5", [](hid_t f) { H5Ldelete(f, "images", H5P_DEFAULT); });
  e = open_error();
  EXPECT_NE(e.find("missing dataset '/images'"), std::string::npos) << e;

  write();
  tamper("train-00001-of-00003.h5", [](hid_t f) {
    H5Ldelete(f, "images", H5P_DEFAULT);
    hsize_t dims[2] = {3, 24};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    H5Dclose(H5Dcreate2(f, "images", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Sclose(space);
  });
  e = open_error();
  EXPECT_NE(e.find("rank 2, expected 4"), std::string::npos) << e;
}

TEST_F(Shards, ShapeMismatchCountMismatchAndBadLabels) {
  write();
  tamper("train-00001-of-00003.h5", [](hid_t f) {
    H5Ldelete(f, "images", H5P_DEFAULT);
    hsize_t dims[4] = {3, 4, 4, 2};
    hid_t space = H5Screate_simple(4, dims, nullptr);
    H5Dclose(H5Dcreate2(f, "images", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Sclose(space);
  });
  std::string e = open_error();
  EXPECT_NE(e.find("4x4x2"), std::string::npos) << e;
  EXPECT_NE(e.find("4x3x2"), std::string::npos) << e;

  write();
  tamper("train-00001-of-00003.h5", [](hid_t f) {
    H5Ldelete(f, "labels", H5P_DEFAULT);
    hsize_t dims[1] = {2};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t ds = H5Dcreate2(f, "labels", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int32_t v[2] = {0, 1};
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(ds);
    H5Sclose(space);
  });
  e = open_error();
  EXPECT_NE(e.find("3 images but 2 labels"), std::string::npos) << e;

  write();
  tamper("train-00002-of-00003.h5", [](hid_t f) {
    hid_t ds = H5Dopen2(f, "labels", H5P_DEFAULT);
    int32_t v[4] = {0, 1, 7, 2};
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(ds);
  });
  e = open_error();
  EXPECT_NE(e.find("label 7 outside [0, 3)"), std::string::npos) << e;
  EXPECT_NE(e.find("train-00002-of-00003.h5"), std::string::npos) << e;
}

TEST_F(Shards, ManifestThatDisagreesWithTheFiles) {
  write();
  nlohmann::json m = nlohmann::json::parse(std::ifstream(dir_ / "manifest.json"));
  m["splits"]["train"]["shards"][1]["records"] = 4;
  m["splits"]["train"]["records"] = 11;
  std::ofstream(dir_ / "manifest.json") << m.dump(2);
  std::string e = open_error();
  EXPECT_NE(e.find("train-00001-of-00003.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("the manifest says 4"), std::string::npos) << e;

  write();
  fs::copy_file(dir_ / "train-00000-of-00003.h5", dir_ / "train-00007-of-00009.h5");
  e = open_error();
  EXPECT_NE(e.find("train-00007-of-00009.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("not listed"), std::string::npos) << e;

  // A shard name that is a folder is named as one, not as "corrupt: CRC-32 00000000".
  write();
  fs::remove(dir_ / "train-00001-of-00003.h5");
  fs::create_directory(dir_ / "train-00001-of-00003.h5");
  e = open_error();
  EXPECT_NE(e.find("shard '" + (dir_ / "train-00001-of-00003.h5").string() + "' is a folder, not a file"),
            std::string::npos)
      << e;
  fs::remove_all(dir_ / "train-00001-of-00003.h5");

  write();
  m = nlohmann::json::parse(std::ifstream(dir_ / "manifest.json"));
  m["format_version"] = 99;
  std::ofstream(dir_ / "manifest.json") << m.dump(2);
  EXPECT_NE(open_error().find("format_version 99"), std::string::npos);
}

// Each bad manifest entry is refused when the split is opened, naming the manifest, the split and the key.
TEST_F(Shards, ManifestEntriesAreCheckedNamingTheKey) {
  auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    write();
    nlohmann::json m = nlohmann::json::parse(std::ifstream(dir_ / "manifest.json"));
    edit(m["splits"]["train"]);
    std::ofstream(dir_ / "manifest.json") << m.dump(2);
    return open_error();
  };
  auto expect = [](const std::string& e, const std::string& part) {
    EXPECT_NE(e.find(part), std::string::npos) << e;
    EXPECT_NE(e.find("manifest.json'"), std::string::npos) << e;  // the file, and the key from its top
  };
  expect(edited([](auto& s) { s["shards"][2] = s["shards"][0]; }),
         "shard 'train-00000-of-00003.h5' is listed twice (shards[2])");
  expect(
      edited([](auto& s) { s["shards"][1]["file"] = "../elsewhere/train-00001-of-00003.h5"; }),
      "key 'splits.train.shards[1].file' is '../elsewhere/train-00001-of-00003.h5', not a shard file of split 'train'");
  expect(edited([](auto& s) { s["shards"][1]["file"] = "/tmp/train-00001-of-00003.h5"; }), "not a shard file");
  expect(edited([](auto& s) { s["shards"][1]["file"] = "test-00001-of-00003.h5"; }),
         "not a shard file of split 'train'");
  expect(edited([](auto& s) { s["records"] = 10.5; }),
         "key 'splits.train.records' must be an integer from 0 to 1099511627776, got 10.5");
  expect(edited([](auto& s) { s["shards"][0]["records"] = -3; }),
         "key 'splits.train.shards[0].records' must be an integer from 0 to");
  expect(edited([](auto& s) { s["records"] = 1e300; }), "key 'splits.train.records' must be an integer");
  expect(edited([](auto& s) { s["num_classes"] = "3"; }), "key 'splits.train.num_classes' must be an integer");
  expect(edited([](auto& s) { s["image_shape"] = {4, 3}; }), "key 'splits.train.image_shape' must be [H, W, C]");
  expect(edited([](auto& s) { s["image_shape"][1] = 0; }),
         "key 'splits.train.image_shape[1]' must be a whole number from 1");
  expect(edited([](auto& s) { s["shards"][0]["crc32"] = "xyz"; }),
         "key 'splits.train.shards[0].crc32' must be 8 hex digits");
  expect(edited([](auto& s) { s["shards"] = nlohmann::json::array(); }),
         "key 'splits.train.shards' must be a non-empty list");
  expect(edited([](auto& s) { s.erase("num_classes"); }), "key 'splits.train.num_classes' is missing (given)");
  expect(edited([](auto& s) {
           s["std"] = {0.5, 0.0};
         }),
         "key 'splits.train.std[1]' is 0: a standard deviation must be above 0");
  expect(edited([](auto& s) { s["std"] = {0.5, -1.0}; }), "key 'splits.train.std[1]' is -1");
  // Normalisation is per channel: none at all trained unnormalised without a word (two for one was refused).
  expect(edited([](auto& s) { s["std"] = nlohmann::json::array(); }),
         "key 'splits.train.std' is missing or empty for 2 channels: the images are normalised per channel");
  expect(edited([](auto& s) { s.erase("mean"); }), "key 'splits.train.mean' is missing or empty for 2 channels");
  expect(edited([](auto& s) { s["mean"] = {0.5, 0.5, 0.5}; }), "key 'splits.train.mean' has 3 entries for 2 channels");
  expect(edited([](auto& s) { s["classes"] = 5; }), "key 'splits.train.classes' must be a list of strings, got 5");
  expect(edited([](auto& s) { s["mean"] = {"a", 1}; }), "key 'splits.train.mean' must be a list of finite numbers");
  expect(edited([](auto& s) { s["encoded"] = "no"; }), "key 'splits.train.encoded' must be true or false");
  for (const char* text : {"[1, 2]", "", "{\"format\": 5}",
                           "{\"format\": \"ringtrain-shards\", \"format_version\": "
                           "\"two\"}"}) {
    write();
    std::ofstream(dir_ / "manifest.json") << text;
    const std::string e = open_error();
    EXPECT_NE(e.find("manifest.json'"), std::string::npos) << e;
    EXPECT_EQ(e.find("type_error"), std::string::npos) << e;  // nlohmann's raw text names no file or key
  }
  expect(edited([](auto& s) { s["records"] = 18446744073709551615ull; }),
         "key 'splits.train.records' must be an integer");
  expect(edited([](auto& s) { s["num_classes"] = -1e300; }), "key 'splits.train.num_classes' must be an integer");
  // A manifest too large to be one (64 MiB) is refused before it is read whole.
  write();
  {
    std::ofstream big(dir_ / "manifest.json");
    big << "{\"pad\": \"" << std::string((64 << 20) + 1, 'x') << "\"}";
  }
  EXPECT_NE(open_error().find("more than the 67108864 such a file may have"), std::string::npos);
  // A split named to climb out of the folder, with a matching file name, is refused by its name.
  write();
  nlohmann::json m = nlohmann::json::parse(std::ifstream(dir_ / "manifest.json"));
  m["splits"]["../outside"] = m["splits"]["train"];
  m["splits"]["../outside"]["shards"] = {
      {{"file", "../outside-00000-of-00001.h5"}, {"records", 10}, {"crc32", "00000000"}}};
  std::ofstream(dir_ / "manifest.json") << m.dump(2);
  const std::string e = testing::error_of([&] { ShardDataset::open(dir_, "../outside"); });
  EXPECT_NE(e.find("split '../outside': the split name must be non-empty, without '/'"), std::string::npos) << e;
}

// A shard's own attributes must agree with where the manifest puts it (a file copied between datasets or
// renamed); the checksum is fixed up so that only the attribute is wrong.
TEST_F(Shards, AShardWhoseAttributesDisagreeWithTheManifestIsRefused) {
  auto set_int = [](hid_t f, const char* name, int32_t v) {
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT32, &v);
    H5Aclose(a);
  };
  write();
  tamper("train-00001-of-00003.h5", [&](hid_t f) { set_int(f, "shard_index", 2); });
  std::string e = open_error();
  EXPECT_NE(e.find("train-00001-of-00003.h5': attributes say shard 2 of 3 but the manifest lists it as shard 1 of 3"),
            std::string::npos)
      << e;
  write();
  tamper("train-00002-of-00003.h5", [&](hid_t f) { set_int(f, "num_shards", 4); });
  EXPECT_NE(open_error().find("shard 2 of 4 but the manifest lists it as shard 2 of 3"), std::string::npos);
  write();
  tamper("train-00000-of-00003.h5", [](hid_t f) {
    H5Adelete(f, "split");
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, 4);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "split", type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, type, "test");
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
  });
  e = open_error();
  EXPECT_NE(e.find("attribute 'split' is 'test' but the manifest lists it in split 'train'"), std::string::npos) << e;
}

TEST_F(Shards, RewritingWithFewerShardsRemovesStaleFiles) {
  write("train", 4, 10);
  write("train", 2, 10);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.path().extension() == ".h5";
  EXPECT_EQ(files, 2);
  EXPECT_EQ(ShardDataset::open(dir_, "train").size(), 10);
}

// ------------------------------------------------------------------------------------------------ segmentation

// 10 records of 4x3x2 (as write()) with masks of 3 classes: pixel i of record r holds (r + i) % 4, class 3 read
// as 255 (ignored), so each record has its own most frequent class.
SplitInfo write_segmentation(const fs::path& dir, int shards = 3) {
  WriterOptions o = split_options(dir, shards, 10, 4, 3, 2, 3);
  o.segmentation = true;
  ShardWriter w(o);
  std::vector<uint8_t> image(24), mask(12);
  for (int64_t r = 0; r < 10; ++r) {
    for (int64_t i = 0; i < 24; ++i) image[static_cast<size_t>(i)] = static_cast<uint8_t>((r * 7 + i) % 256);
    for (int64_t i = 0; i < 12; ++i) {
      const int v = static_cast<int>((r + i) % 4);
      mask[static_cast<size_t>(i)] = static_cast<uint8_t>(v == 3 ? 255 : v);
    }
    w.add(image.data(), 99, mask.data());  // the label is the mask's
  }
  return w.finish();
}

uint8_t mask_value(int64_t r, int64_t i) {
  const int v = static_cast<int>((r + i) % 4);
  return static_cast<uint8_t>(v == 3 ? 255 : v);
}

TEST_F(Shards, SegmentationMasksRoundTripAsVersion4) {
  SplitInfo written = write_segmentation(dir_);
  EXPECT_TRUE(written.segmentation);
  ShardDataset ds = ShardDataset::open(dir_, "train");
  EXPECT_TRUE(ds.info().segmentation);
  EXPECT_EQ(ds.info().ignore_index, 255);
  EXPECT_EQ(ds.info().mask_bytes(), 12);
  const std::vector<int64_t> picks{9, 0, 4, 3, 5};  // across every shard boundary, out of order
  std::vector<uint8_t> masks(picks.size() * 12);
  ds.read_masks(picks, masks.data());
  for (size_t k = 0; k < picks.size(); ++k)
    for (int64_t i = 0; i < 12; ++i)
      ASSERT_EQ(masks[k * 12 + static_cast<size_t>(i)], mask_value(picks[k], i)) << "record " << picks[k];
  // The label of a record is its mask's most frequent class (ties: the lowest), not what add() was given.
  for (int64_t r = 0; r < 10; ++r) {
    std::array<int, 3> counts{};
    for (int64_t i = 0; i < 12; ++i)
      if (mask_value(r, i) != 255) ++counts[mask_value(r, i)];
    EXPECT_EQ(ds.label(r), std::max_element(counts.begin(), counts.end()) - counts.begin()) << r;
  }
  // Images read as any split's.
  std::vector<uint8_t> images(24);
  std::vector<int32_t> labels(1);
  ds.read_range(7, 1, images.data(), labels.data());
  EXPECT_EQ(images[5], (7 * 7 + 5) % 256);
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(dir_ / "manifest.json"));
  EXPECT_EQ(m["format_version"], 4);
  EXPECT_EQ(m["splits"]["train"]["task"], "segmentation");
  EXPECT_EQ(m["splits"]["train"]["ignore_index"], 255);
  // A classification split beside it keeps its own version's entries; the dataset is version 4.
  write("test", 1, 4);
  const nlohmann::json both = nlohmann::json::parse(std::ifstream(dir_ / "manifest.json"));
  EXPECT_EQ(both["format_version"], 4);
  EXPECT_FALSE(both["splits"]["test"].contains("task"));
  ShardDataset test = ShardDataset::open(dir_, "test");
  EXPECT_FALSE(test.info().segmentation);
  std::vector<uint8_t> none(12);
  try {
    test.read_masks({0}, none.data());
    ADD_FAILURE() << "read_masks on a classification split";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no masks"), std::string::npos) << e.what();
  }
}

TEST_F(Shards, TheWriterRefusesMasksItCannotKeep) {
  WriterOptions o = split_options(dir_, 1, 2, 2, 2, 1, 3);
  o.segmentation = true;
  {
    ShardWriter w(o);
    const std::vector<uint8_t> image(4, 7), bad{0, 1, 255, 3};
    try {
      w.add(image.data(), 0, bad.data());
      ADD_FAILURE() << "class 3 of 3 accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("record 0"), std::string::npos) << what;
      EXPECT_NE(what.find("class 3 at pixel (1, 1)"), std::string::npos) << what;
      EXPECT_NE(what.find("outside [0, 3)"), std::string::npos) << what;
    }
    try {
      w.add(image.data(), 0);
      ADD_FAILURE() << "a segmentation record without its mask";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("give each record's mask"), std::string::npos) << e.what();
    }
  }
  o.segmentation = false;
  {
    ShardWriter w(o);
    const std::vector<uint8_t> image(4, 7), mask(4, 0);
    EXPECT_THROW(w.add(image.data(), 0, mask.data()), Error);
  }
  o.segmentation = true;
  o.num_classes = 300;
  EXPECT_THROW(ShardWriter{o}, Error);
  o.num_classes = 3;
  o.encoded = true;
  EXPECT_THROW(ShardWriter{o}, Error);
}

TEST_F(Shards, DamagedMasksAreRefusedNamingFileAndRecord) {
  // A class outside the split's range, written behind the writer's back: read_masks names shard, record, pixel.
  write_segmentation(dir_);
  tamper("train-00001-of-00003.h5", [](hid_t f) {
    hid_t ds = H5Dopen2(f, "masks", H5P_DEFAULT);
    std::vector<uint8_t> v(3 * 12);
    H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    v[12 + 4] = 7;  // record 1 of the shard, pixel (1, 1)
    H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Dclose(ds);
  });
  {
    ShardDataset ds = ShardDataset::open(dir_, "train");
    std::vector<uint8_t> masks(12);
    const int64_t record = ds.info().shards[0].records + 1;
    try {
      ds.read_masks({record}, masks.data());
      ADD_FAILURE() << "class 7 of 3 read";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("train-00001-of-00003.h5"), std::string::npos) << what;
      EXPECT_NE(what.find("'/masks' record 1: class 7 at pixel (1, 1)"), std::string::npos) << what;
    }
  }
  // No /masks.
  write_segmentation(dir_);
  tamper("train-00002-of-00003.h5", [](hid_t f) { H5Ldelete(f, "masks", H5P_DEFAULT); });
  std::string e = open_error();
  EXPECT_NE(e.find("missing dataset '/masks'"), std::string::npos) << e;
  EXPECT_NE(e.find("train-00002-of-00003.h5"), std::string::npos) << e;
  // Masks of another size than the images.
  write_segmentation(dir_);
  tamper("train-00000-of-00003.h5", [](hid_t f) {
    H5Ldelete(f, "masks", H5P_DEFAULT);
    hsize_t dims[3] = {4, 3, 4};
    hid_t space = H5Screate_simple(3, dims, nullptr);
    H5Dclose(H5Dcreate2(f, "masks", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Sclose(space);
  });
  e = open_error();
  EXPECT_NE(e.find("masks of 4x3 (one per image, of the images' size)"), std::string::npos) << e;
  // A shard that is not a segmentation shard under a manifest that says the split is one.
  write_segmentation(dir_);
  tamper("train-00000-of-00003.h5", [](hid_t f) { H5Adelete(f, "task"); });
  e = open_error();
  EXPECT_NE(e.find("is a segmentation split but the shard is not one"), std::string::npos) << e;
  // A manifest task that is neither.
  write_segmentation(dir_);
  nlohmann::json m = nlohmann::json::parse(std::ifstream(dir_ / "manifest.json"));
  m["splits"]["train"]["task"] = "detection";
  std::ofstream(dir_ / "manifest.json") << m.dump(2);
  e = open_error();
  EXPECT_NE(e.find("is 'detection', expected classification or segmentation"), std::string::npos) << e;
}

}  // namespace
}  // namespace ringtrain::data
