// data/idx.h: readers for the idx files MNIST and Fashion-MNIST ship in (big-endian header, then raw
// uint8 data), gzipped or not. Every error names the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace ringtrain::data {

struct IdxImages {
  std::filesystem::path path;  // the file actually read (NAME or NAME.gz)
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // (count, rows, cols) row-major
};

struct IdxLabels {
  std::filesystem::path path;
  int64_t count = 0;
  std::vector<uint8_t> labels;  // (count)
};

// `path` is NAME; NAME.gz is tried when NAME does not exist. Either may be gzipped (zlib reads plain
// files transparently). Throws ringtrain::Error for a missing file, a bad magic number (0x803 images,
// 0x801 labels, both uint8), a corrupt gzip stream, or a size that disagrees with the header.
IdxImages read_idx_images(const std::filesystem::path& path);
IdxLabels read_idx_labels(const std::filesystem::path& path);

struct IdxSplit {
  IdxImages images;
  IdxLabels labels;
};
// Both files of a split; throws when their counts differ (the message names both files).
IdxSplit read_idx_split(const std::filesystem::path& images_path, const std::filesystem::path& labels_path);

}  // namespace ringtrain::data
