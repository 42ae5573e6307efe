// data/shards.h: the HDF5 shard format (docs/DATA_FORMAT.md): ShardWriter writes a split as shard
// files plus manifest.json and validates what it wrote; ShardDataset opens a split, validates every
// shard against the manifest, and reads records by global index. All HDF5 calls in the process go
// through one lock (hdf5_mutex()): the serial HDF5 library is not thread-safe. Decoded images are read
// without it: their byte offsets come from HDF5's chunk index once, at open, and reads are pread calls. Sources:
// manifest.cpp (names, checksums, manifest.json), shard_writer.cpp and shard_dataset.cpp; HDF5 helpers: io/hdf5.h.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace ringtrain::data {

inline constexpr const char* kFormatName = "ringtrain-shards";
// Version 2 stores encoded images as /encoded (every record's bytes back to back) + /offsets; version 1
// stored them as a variable-length /jpeg, which is still read (through HDF5, under its lock). Decoded
// (/images) shards are the same in both. Version 3 is version 2 plus splits whose encoded images keep
// their own sizes (image_shape [0, 0, C]; each record's shape in /shapes): only such splits are written
// as version 3, so every other dataset stays readable by a version 2 reader. Version 4 adds segmentation splits:
// decoded images with a (H, W) uint8 mask of classes per record in /masks (ignore_index, 255, for pixels that
// count for nothing); again only such splits are written as version 4.
inline constexpr int kFormatVersion = 4;
inline constexpr int kOldestReadableFormatVersion = 1;

// The lock every HDF5 call in ringtrain takes (the same one as ringtrain::h5::lock()).
std::recursive_mutex& hdf5_mutex();

// "train-00003-of-00016.h5"
std::string shard_file_name(const std::string& split, int index, int count);

struct ShardInfo {
  std::string file;  // file name inside the dataset folder
  int64_t records = 0;
  uint32_t crc32 = 0;  // zlib CRC-32 of the whole file
};

struct SplitInfo {
  std::string split;
  int64_t records = 0;
  int64_t height = 0, width = 0, channels = 0;  // decoded image shape (all records); 0 x 0: varied_size()
  bool encoded = false;                         // /encoded + /offsets (v1: /jpeg) instead of /images
  int num_classes = 0;
  std::vector<std::string> classes;  // optional class names
  std::vector<float> mean, std;      // per channel, of pixel / 255
  std::string source;
  std::vector<ShardInfo> shards;
  // Segmentation: each record's labels are a (height, width) mask of classes in /masks, pixels equal to
  // ignore_index belonging to no class (its /labels entry is the mask's most frequent class, for samplers).
  bool segmentation = false;
  int ignore_index = 255;
  int64_t record_bytes() const { return height * width * channels; }
  int64_t mask_bytes() const { return height * width; }
  // Encoded records of their own sizes (make_shards imagefolder --size 0): they have one shape only after
  // a random-resized crop. Each record's decoded shape is ShardDataset::record_shape().
  bool varied_size() const { return height == 0; }
  // "224x224x3", or "varied x 3" for varied_size()
  std::string shape_text() const;
  // The format version this split's shards and manifest are written as (4 if segmentation, 3 if
  // varied_size(), else 2).
  int format_version() const { return segmentation ? 4 : varied_size() ? 3 : 2; }
};

struct WriterOptions {
  std::filesystem::path dir;  // created if missing
  std::string split = "train";
  int num_shards = 1;
  int64_t total_records = 0;                    // must be known up front (records go to shards in contiguous blocks)
  int64_t height = 0, width = 0, channels = 0;  // height = width = 0: encoded records of varied sizes
  bool encoded = false;                         // add_encoded() instead of add()
  int num_classes = 0;
  std::vector<std::string> classes;
  std::string source;
  bool show_progress = false;  // a progress line on stderr
  bool segmentation = false;   // add() takes each record's (height, width) mask (decoded images only)
};

// Writes one split. Call add() (or add_encoded()) exactly total_records times, then finish(), which
// writes mean/std into every shard, updates manifest.json (other splits already there are kept), and
// re-opens the split with full validation. Destroying an unfinished writer removes its partial files.
class ShardWriter {
 public:
  explicit ShardWriter(WriterOptions options);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // image: height*width*channels bytes, HWC. A segmentation split's records also take their mask:
  // height*width bytes, each a class below num_classes or 255 (ignored); the label is then the mask's most
  // frequent class (0 when every pixel is ignored) and `label` is not read.
  void add(const uint8_t* image, int32_t label, const uint8_t* mask = nullptr);
  // bytes: an encoded JPEG/PNG; decoded_hwc: its decoded shape (must equal the split's shape, or have its
  // channels for a split of varied sizes);
  // channel_sums: sum and sum of squares of pixel/255 per channel of the decoded image, for mean/std.
  void add_encoded(const std::vector<uint8_t>& bytes, const int64_t decoded_hwc[3], int32_t label,
                   const std::vector<double>& channel_sums, const std::vector<double>& channel_squares);
  SplitInfo finish();
  int64_t written() const { return written_; }

 private:
  struct Impl;
  Impl* impl_;
  int64_t written_ = 0;
};

// One split of a dataset, validated on open. Reads are thread-safe: decoded images without any lock
// (pread at offsets resolved at open), encoded records under hdf5_mutex().
class ShardDataset {
 public:
  struct OpenOptions {
    bool verify_checksums = true;
    bool check_labels = true;  // read every label and check the range
    bool allow_empty = false;  // a split of 0 records is an error unless allowed
    // Decoded images are read with pread at the byte offsets HDF5's chunk index gives at open (no library
    // lock, so threads scale); off, or for a layout pread cannot serve, through HDF5 under its lock.
    bool direct_reads = true;
  };
  static ShardDataset open(const std::filesystem::path& dir, const std::string& split, OpenOptions options);
  static ShardDataset open(const std::filesystem::path& dir, const std::string& split) {
    return open(dir, split, OpenOptions{});
  }
  ShardDataset(ShardDataset&&) noexcept;
  ShardDataset& operator=(ShardDataset&&) noexcept;
  ~ShardDataset();

  const SplitInfo& info() const { return info_; }
  int64_t size() const { return info_.records; }
  // Records [begin, begin + count) by global index: images (count x H x W x C bytes, decoded if the split
  // is encoded) and labels. Ranges may cross shard boundaries. A file that changed since open (shorter
  // than its records) is an error naming the file and the record. Not for varied_size() splits, whose
  // records have no common shape: read_encoded() and decode them one by one.
  void read_range(int64_t begin, int64_t count, uint8_t* images, int32_t* labels) const;
  // Arbitrary records; sorted contiguous runs are read together.
  void read_indices(const std::vector<int64_t>& indices, uint8_t* images, int32_t* labels) const;
  // A segmentation split's masks of these records (height*width bytes each, in the order given), read like the
  // images (pread, no lock); a value that is neither a class nor the ignore index is an error naming the record.
  void read_masks(const std::vector<int64_t>& indices, uint8_t* masks) const;
  // For encoded splits: the raw bytes of one record (decoding happens outside the HDF5 lock).
  std::vector<uint8_t> read_encoded(int64_t index, int32_t* label) const;
  // A record's label alone (held in memory since open: no read).
  int32_t label(int64_t index) const;
  // Global index -> (shard, index within shard).
  std::pair<int, int64_t> locate(int64_t index) const;
  // The decoded (H, W, C) of a record: the split's shape, or for varied_size() splits the record's own.
  std::array<int64_t, 3> record_shape(int64_t index) const;
  // "shard '/data/train-00001-of-00004.h5', '/encoded' record 17": where a record lives, for errors.
  std::string record_name(int64_t index) const;
  // Records per HDF5 chunk of /images (the unit a sampler should keep together for I/O locality).
  int64_t chunk_records() const;
  // Shards whose decoded images are read with pread (the rest go through HDF5).
  int direct_shards() const;

 private:
  ShardDataset() = default;
  struct Impl;
  SplitInfo info_;
  Impl* impl_ = nullptr;
};

// Reads manifest.json of a dataset folder (all splits); errors name the file.
std::vector<SplitInfo> read_manifest(const std::filesystem::path& dir);
uint32_t file_crc32(const std::filesystem::path& path);
int64_t chunk_records_for(int64_t record_bytes);

}  // namespace ringtrain::data
