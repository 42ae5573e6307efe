// data/converters.h: turn source datasets into ringtrain shards (docs/DATA_FORMAT.md), one function per
// source format: idx (MNIST, Fashion-MNIST), the CIFAR-10/100 binary versions, a class-per-subfolder
// image tree, and synthetic data. Each writes every split the source has through ShardWriter, whose
// finish() computes mean/std, updates manifest.json and re-opens the split with full validation.
// Errors name the source file or folder that was wrong.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/shards.h"

namespace ringtrain::data {

struct ConvertOptions {
  // Shards of the largest split (train). Smaller splits get proportionally fewer, at least one:
  // ceil(num_shards * records / train_records), so a 10k test split next to 60k train in 4 shards is 1.
  int num_shards = 1;
  uint64_t seed = 0;           // imagefolder shuffle and synthetic pixels
  bool show_progress = false;  // ShardWriter's progress line on stderr
};

struct ConvertResult {
  std::vector<SplitInfo> splits;   // in the order written (train first)
  std::vector<std::string> notes;  // things worth telling the user, e.g. files that were skipped
};

// Shard count for a split of `records` next to the largest split of `largest_records` (see above).
int shards_for_split(int num_shards, int64_t records, int64_t largest_records);

// A deterministic Fisher-Yates permutation of [0, n) drawn from philox(seed, stream).
std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, uint64_t stream);

// name: "fashion-mnist" or "mnist". src holds train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each optionally .gz). Splits "train" and "test".
ConvertResult convert_idx(const std::filesystem::path& src, const std::filesystem::path& out, const std::string& name,
                          const ConvertOptions& options);

// num_classes: 10 or 100. src is the extracted binary folder (cifar-10-batches-bin / cifar-100-binary)
// or the folder above it. CIFAR-10: data_batch_1..5.bin -> "train", test_batch.bin -> "test", records
// of 1 label byte + 3072 bytes CHW; class names from batches.meta.txt when present. CIFAR-100: train.bin,
// test.bin, records of coarse + fine label bytes + 3072 (the fine label is used); names from
// fine_label_names.txt when present.
ConvertResult convert_cifar(const std::filesystem::path& src, const std::filesystem::path& out, int num_classes,
                            const ConvertOptions& options);

// How imagefolder stores images: decoded pixels (/images) or re-encoded as JPEG (/encoded + /offsets).
enum class ImageStorage { kPixels, kJpeg };

struct ImageFolderOptions {
  // Output is size x size (shorter side resized to size, then center-cropped). 0, with kJpeg: every image
  // keeps its own size and its own bytes (re-encoded only if its channel count must change), a split of
  // varied sizes (SplitInfo::varied_size()) for random-resized crops at training time.
  int64_t size = 224;
  int64_t channels = 3;  // 1 or 3; images with the other count are converted (gray replicated, RGB to luma)
  ImageStorage storage = ImageStorage::kPixels;
  int jpeg_quality = 95;  // for ImageStorage::kJpeg
  // An image libjpeg decodes only with warnings (corrupt entropy data) is an error naming it; otherwise such
  // images are counted per split in the result's notes.
  bool strict = false;
};

// src/train/<class>/... plus src/val/<class>/... and src/test/<class>/... when present (splits named
// after the folders); otherwise src/<class>/... as a single "train" split. Classes are the sorted
// subfolder names of the train split; files are found recursively, JPEG/PNG by extension (.jpg, .jpeg,
// .png, any case) and decoded by content. Records are shuffled with options.seed so shards mix classes.
ConvertResult convert_imagefolder(const std::filesystem::path& src, const std::filesystem::path& out,
                                  const ImageFolderOptions& image_options, const ConvertOptions& options);

struct SyntheticSpec {
  int64_t height = 32, width = 32, channels = 3;
  int64_t count = 1000;  // train records; "test" gets max(1, count / 5)
  int num_classes = 10;
  ImageStorage storage = ImageStorage::kPixels;  // kJpeg: each record JPEG-encoded (1 or 3 channels)
  int jpeg_quality = 90;
};

// Each class has a fixed random template; a record is the mean of its class's template and uniform
// noise, with a random label, so a model can learn it. All from philox(options.seed). Encoded as JPEG,
// the mean/std are those of the pixels before encoding (as for imagefolder).
ConvertResult convert_synthetic(const std::filesystem::path& out, const SyntheticSpec& spec,
                                const ConvertOptions& options);

// ------------------------------------------------------------------------------------------------ segmentation

struct SegmentationFolderOptions {
  // > 0: every image resized as imagefolder does (shorter side to size, central size x size window) and its mask
  // alike by the nearest pixel; 0: every image and mask already of one size.
  int64_t size = 0;
  int64_t channels = 3;  // 1 or 3; images with the other count are converted
  int num_classes = 0;   // 0: one more than the largest class the train masks hold (255, ignored, aside)
};

// src/images/<name>.(jpg|jpeg|png) with src/masks/<name>.png, or those two folders under src/train, src/val and
// src/test (splits named after them). A mask is a one-channel PNG of classes (grayscale or palette indices, as
// VOC's; 255 = ignored) of its image's size; every image needs its mask and every mask its image. Records are
// shuffled with options.seed so shards mix images. Errors name the file.
ConvertResult convert_segmentation_folder(const std::filesystem::path& src, const std::filesystem::path& out,
                                          const SegmentationFolderOptions& segmentation, const ConvertOptions& options);

struct SyntheticSegmentationSpec {
  int64_t size = 64, channels = 3;
  int64_t count = 512;  // train records; "test" gets max(1, count / 5)
  int num_classes = 4;  // class 0 is the background
};

// Images of a background and up to four rectangles and discs over it, each shape's class fixing its colour
// (noise added), the mask holding each pixel's class (the last shape drawn wins): a map a segmentation model can
// learn. All from philox(options.seed). Splits "train" and "test".
ConvertResult convert_synthetic_segmentation(const std::filesystem::path& out, const SyntheticSegmentationSpec& spec,
                                             const ConvertOptions& options);

}  // namespace ringtrain::data
