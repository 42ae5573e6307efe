// data/shard_writer.cpp: ShardWriter — records into partial shard files in contiguous blocks, attributes,
// checksums and the rename into place, then the manifest update and a full validation of what was written.
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/check.h"
#include "data/shard_format.h"

namespace ringtrain::data {
namespace fs = std::filesystem;

using format::check;

constexpr hsize_t kEncodedChunkBytes = 1 << 20;

struct ShardWriter::Impl {
  WriterOptions options;
  int64_t record_bytes = 0, chunk = 0;
  std::vector<int64_t> shard_begin;  // global index where each shard starts (size num_shards + 1)
  int current = -1;                  // open shard
  h5::Id file, images, labels_ds, shapes_ds, masks;
  std::vector<uint8_t> pending;        // records not yet written to the current shard (<= chunk)
  std::vector<uint8_t> pending_masks;  // segmentation: their masks
  int64_t pending_first = 0;           // local index of pending's first record
  std::vector<int32_t> labels;         // current shard's labels
  std::vector<int32_t> shapes;         // current shard's decoded shapes (encoded splits)
  std::vector<int64_t> offsets;  // encoded: where each record of the current shard starts in /encoded, then the end
  int64_t encoded_written = 0;   // encoded: bytes of /encoded already in the file
  std::vector<double> sums, squares;  // per channel, over all records
  double pixels = 0;                  // pixels per channel the sums cover
  std::vector<ShardInfo> shards;
  std::vector<fs::path> temp_files;
  bool finished = false;

  fs::path temp_path(int i) const {
    return options.dir / (shard_file_name(options.split, i, options.num_shards) + ".partial");
  }

  void open_shard(int i) {
    std::lock_guard<std::recursive_mutex> lock(h5::lock());
    h5::silence_errors();
    const fs::path path = temp_path(i);
    const int64_t n = shard_begin[static_cast<size_t>(i) + 1] - shard_begin[static_cast<size_t>(i)];
    file = h5::Id(check(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), path, "", "create file"),
                  H5Fclose);
    temp_files.push_back(path);
    if (!options.encoded) {
      hsize_t dims[4] = {static_cast<hsize_t>(n), static_cast<hsize_t>(options.height),
                         static_cast<hsize_t>(options.width), static_cast<hsize_t>(options.channels)};
      h5::Id space(check(H5Screate_simple(4, dims, nullptr), path, "/images", "create dataspace"), H5Sclose);
      h5::Id plist(check(H5Pcreate(H5P_DATASET_CREATE), path, "/images", "create property list"), H5Pclose);
      if (n > 0) {
        hsize_t chunk_dims[4] = {static_cast<hsize_t>(std::min(chunk, n)), dims[1], dims[2], dims[3]};
        check(H5Pset_chunk(plist, 4, chunk_dims), path, "/images", "set chunking");
      }
      images = h5::Id(check(H5Dcreate2(file, "images", H5T_STD_U8LE, space, H5P_DEFAULT, plist, H5P_DEFAULT), path,
                            "/images", "create dataset"),
                      H5Dclose);
      if (options.segmentation) {
        // (N, H, W) in chunks of the images' records, unfiltered: a reader preads them as it does the images.
        hsize_t mdims[3] = {dims[0], dims[1], dims[2]};
        h5::Id mspace(check(H5Screate_simple(3, mdims, nullptr), path, "/masks", "create dataspace"), H5Sclose);
        h5::Id mplist(check(H5Pcreate(H5P_DATASET_CREATE), path, "/masks", "create property list"), H5Pclose);
        if (n > 0) {
          hsize_t mchunk[3] = {static_cast<hsize_t>(std::min(chunk, n)), dims[1], dims[2]};
          check(H5Pset_chunk(mplist, 3, mchunk), path, "/masks", "set chunking");
        }
        masks = h5::Id(check(H5Dcreate2(file, "masks", H5T_STD_U8LE, mspace, H5P_DEFAULT, mplist, H5P_DEFAULT), path,
                             "/masks", "create dataset"),
                       H5Dclose);
      }
    } else {
      // Every record's bytes back to back (chunks of 1 MiB, unfiltered: byte ranges of the file a reader
      // can pread), with /offsets written at the end.
      hsize_t dims[1] = {0}, max_dims[1] = {H5S_UNLIMITED}, chunk_dims[1] = {kEncodedChunkBytes};
      h5::Id space(check(H5Screate_simple(1, dims, max_dims), path, "/encoded", "create dataspace"), H5Sclose);
      h5::Id plist(check(H5Pcreate(H5P_DATASET_CREATE), path, "/encoded", "create property list"), H5Pclose);
      check(H5Pset_chunk(plist, 1, chunk_dims), path, "/encoded", "set chunking");
      images = h5::Id(check(H5Dcreate2(file, "encoded", H5T_STD_U8LE, space, H5P_DEFAULT, plist, H5P_DEFAULT), path,
                            "/encoded", "create dataset"),
                      H5Dclose);
    }
    current = i;
    pending.clear();
    pending_masks.clear();
    pending_first = 0;
    labels.clear();
    shapes.clear();
    offsets.assign(1, 0);
    encoded_written = 0;
  }

  void flush_encoded() {
    if (pending.empty() || !options.encoded) return;
    std::lock_guard<std::recursive_mutex> lock(h5::lock());
    const fs::path path = temp_path(current);
    hsize_t start[1] = {static_cast<hsize_t>(encoded_written)}, count[1] = {pending.size()},
            size[1] = {static_cast<hsize_t>(encoded_written) + pending.size()};
    check(H5Dset_extent(images, size), path, "/encoded", "extend");
    h5::Id fspace(check(H5Dget_space(images), path, "/encoded", "no dataspace"), H5Sclose);
    check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr), path, "/encoded",
          "select bytes");
    h5::Id mspace(check(H5Screate_simple(1, count, nullptr), path, "/encoded", "create dataspace"), H5Sclose);
    check(H5Dwrite(images, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, pending.data()), path, "/encoded",
          "write records");
    encoded_written += static_cast<int64_t>(pending.size());
    pending.clear();
  }

  void flush_pending() {
    if (pending.empty() || options.encoded) return;
    std::lock_guard<std::recursive_mutex> lock(h5::lock());
    const int64_t count = static_cast<int64_t>(pending.size()) / record_bytes;
    hsize_t start[4] = {static_cast<hsize_t>(pending_first), 0, 0, 0};
    hsize_t counts[4] = {static_cast<hsize_t>(count), static_cast<hsize_t>(options.height),
                         static_cast<hsize_t>(options.width), static_cast<hsize_t>(options.channels)};
    const fs::path path = temp_path(current);
    h5::Id fspace(check(H5Dget_space(images), path, "/images", "no dataspace"), H5Sclose);
    check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, counts, nullptr), path, "/images",
          "select records");
    h5::Id mspace(check(H5Screate_simple(4, counts, nullptr), path, "/images", "create dataspace"), H5Sclose);
    check(H5Dwrite(images, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, pending.data()), temp_path(current),
          "/images", "write records");
    if (options.segmentation) {
      h5::Id mfspace(check(H5Dget_space(masks), path, "/masks", "no dataspace"), H5Sclose);
      check(H5Sselect_hyperslab(mfspace, H5S_SELECT_SET, start, nullptr, counts, nullptr), path, "/masks",
            "select records");
      h5::Id mmspace(check(H5Screate_simple(3, counts, nullptr), path, "/masks", "create dataspace"), H5Sclose);
      check(H5Dwrite(masks, H5T_NATIVE_UINT8, mmspace, mfspace, H5P_DEFAULT, pending_masks.data()), path, "/masks",
            "write masks");
      pending_masks.clear();
    }
    pending_first += count;
    pending.clear();
  }

  void close_shard() {
    if (current < 0) return;
    flush_pending();
    flush_encoded();
    std::lock_guard<std::recursive_mutex> lock(h5::lock());
    const fs::path path = temp_path(current);
    hsize_t dims[1] = {labels.size()};
    h5::Id space(check(H5Screate_simple(1, dims, nullptr), path, "/labels", "create dataspace"), H5Sclose);
    h5::Id ds(check(H5Dcreate2(file, "labels", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path,
                    "/labels", "create dataset"),
              H5Dclose);
    if (!labels.empty())
      check(H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()), path, "/labels",
            "write labels");
    if (options.encoded) {
      hsize_t sdims[2] = {labels.size(), 3};
      h5::Id sspace(check(H5Screate_simple(2, sdims, nullptr), path, "/shapes", "create dataspace"), H5Sclose);
      h5::Id sds(check(H5Dcreate2(file, "shapes", H5T_STD_I32LE, sspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path,
                       "/shapes", "create dataset"),
                 H5Dclose);
      if (!shapes.empty())
        check(H5Dwrite(sds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, shapes.data()), path, "/shapes",
              "write shapes");
      hsize_t odims[1] = {offsets.size()};
      h5::Id ospace(check(H5Screate_simple(1, odims, nullptr), path, "/offsets", "create dataspace"), H5Sclose);
      h5::Id ods(check(H5Dcreate2(file, "offsets", H5T_STD_I64LE, ospace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path,
                       "/offsets", "create dataset"),
                 H5Dclose);
      check(H5Dwrite(ods, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()), path, "/offsets",
            "write offsets");
    }
    ShardInfo info;
    info.file = shard_file_name(options.split, current, options.num_shards);
    info.records = static_cast<int64_t>(labels.size());
    shards.push_back(info);
    images = h5::Id();
    masks = h5::Id();
    file = h5::Id();
    current = -1;
  }

  void start_record(int64_t global) {
    if (current < 0 || global >= shard_begin[static_cast<size_t>(current) + 1]) {
      close_shard();
      int next =
          static_cast<int>(std::upper_bound(shard_begin.begin(), shard_begin.end(), global) - shard_begin.begin()) - 1;
      // Empty shards (more shards than records) are created on the way.
      for (int s = static_cast<int>(shards.size()); s < next; ++s) {
        open_shard(s);
        close_shard();
      }
      open_shard(next);
    }
  }

  // On a terminal one updating line; otherwise a plain line at every 10%.
  void progress(int64_t written) {
    const int64_t total = options.total_records;
    const bool tty = isatty(fileno(stderr));
    const int64_t step = tty ? std::max<int64_t>(1, total / 200) : std::max<int64_t>(1, total / 10);
    if (written % step != 0 && written != total) return;
    std::fprintf(stderr, tty ? "\r%s: %lld / %lld records%s" : "%s: %lld / %lld records%s\n", options.split.c_str(),
                 static_cast<long long>(written), static_cast<long long>(total), tty && written == total ? "\n" : "");
  }

  void remove_partials() noexcept {
    for (const auto& p : temp_files) {
      std::error_code ec;
      fs::remove(p, ec);
    }
  }
};

ShardWriter::ShardWriter(WriterOptions options) : impl_(nullptr) {
  auto& o = options;
  RT_CHECK(
      !o.split.empty() && o.split.find_first_of("/\\-") == std::string::npos && o.split.find("..") == std::string::npos,
      "ShardWriter: split name '", o.split, "' must be non-empty, without '/', '\\', '-' or '..'");
  RT_CHECK(o.num_shards >= 1 && o.num_shards <= 99999, "ShardWriter: --shards must be from 1 to 99999 (five digits in ",
           "the file names), got ", o.num_shards);
  RT_CHECK(o.total_records >= 0, "ShardWriter: negative record count ", o.total_records);
  const bool varied = o.encoded && o.height == 0 && o.width == 0;
  RT_CHECK((varied || (o.height > 0 && o.width > 0)) && o.channels > 0, "ShardWriter: bad image shape ", o.height, "x",
           o.width, "x", o.channels, o.encoded ? " (0x0xC: encoded images of varied sizes)" : "");
  RT_CHECK(o.num_classes >= 1, "ShardWriter: num_classes must be >= 1, got ", o.num_classes);
  RT_CHECK(o.classes.empty() || static_cast<int>(o.classes.size()) == o.num_classes, "ShardWriter: ", o.classes.size(),
           " class names for ", o.num_classes, " classes");
  RT_CHECK(!o.segmentation || (!o.encoded && o.num_classes <= 255), "ShardWriter: a segmentation split stores ",
           "decoded images and masks of classes below 255 (", o.encoded ? "encoded images given" : "",
           o.num_classes > 255 ? detail::str_cat(o.num_classes, " classes") : "", ")");
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (ec) RT_THROW("cannot create dataset folder '", o.dir.string(), "': ", ec.message());
  impl_ = new Impl;  // only after every check: a throwing constructor never runs the destructor
  impl_->options = std::move(options);
  impl_->record_bytes = impl_->options.height * impl_->options.width * impl_->options.channels;
  impl_->chunk = chunk_records_for(impl_->record_bytes);
  for (int i = 0; i <= impl_->options.num_shards; ++i)
    impl_->shard_begin.push_back(impl_->options.total_records * i / impl_->options.num_shards);
  impl_->sums.assign(static_cast<size_t>(impl_->options.channels), 0.0);
  impl_->squares.assign(static_cast<size_t>(impl_->options.channels), 0.0);
}

ShardWriter::~ShardWriter() {
  if (!impl_->finished) {
    try {
      std::lock_guard<std::recursive_mutex> lock(h5::lock());
      impl_->images = h5::Id();
      impl_->masks = h5::Id();
      impl_->file = h5::Id();
    } catch (...) {
    }
    impl_->remove_partials();
  }
  delete impl_;
}

void ShardWriter::add(const uint8_t* image, int32_t label, const uint8_t* mask) {
  auto& m = *impl_;
  RT_CHECK(!m.options.encoded, "ShardWriter::add on an encoded split (use add_encoded)");
  if (written_ >= m.options.total_records)
    RT_THROW("ShardWriter: more than the announced ", m.options.total_records, " records for split '", m.options.split,
             "'");
  RT_CHECK(
      (mask != nullptr) == m.options.segmentation, "ShardWriter::add: split '", m.options.split, "' ",
      m.options.segmentation ? "is a segmentation split: give each record's mask" : "holds a label per image: no mask");
  if (mask) {
    const int64_t pixels = m.options.height * m.options.width;
    std::vector<int64_t> counts(static_cast<size_t>(m.options.num_classes), 0);
    for (int64_t i = 0; i < pixels; ++i) {
      if (mask[i] == 255) continue;
      if (mask[i] >= m.options.num_classes)
        RT_THROW("ShardWriter: record ", written_, " of split '", m.options.split, "' has class ", int(mask[i]),
                 " at pixel (", i / m.options.width, ", ", i % m.options.width, "), outside [0, ",
                 m.options.num_classes, ") and not 255 (ignored)");
      ++counts[mask[i]];
    }
    label = static_cast<int32_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
  }
  if (label < 0 || label >= m.options.num_classes)
    RT_THROW("ShardWriter: record ", written_, " of split '", m.options.split, "' has label ", label, " outside [0, ",
             m.options.num_classes, ")");
  m.start_record(written_);  // may close a shard and open the next: what is pending goes with the shard it is for
  m.pending.insert(m.pending.end(), image, image + m.record_bytes);
  if (mask) m.pending_masks.insert(m.pending_masks.end(), mask, mask + m.options.height * m.options.width);
  m.labels.push_back(label);
  format::add_channel_sums(image, m.record_bytes, m.options.channels, m.sums, m.squares);
  m.pixels += static_cast<double>(m.options.height * m.options.width);
  if (static_cast<int64_t>(m.pending.size()) >= m.chunk * m.record_bytes) m.flush_pending();
  ++written_;
  if (m.options.show_progress) m.progress(written_);
}

void ShardWriter::add_encoded(const std::vector<uint8_t>& bytes, const int64_t decoded_hwc[3], int32_t label,
                              const std::vector<double>& channel_sums, const std::vector<double>& channel_squares) {
  auto& m = *impl_;
  RT_CHECK(m.options.encoded, "ShardWriter::add_encoded on a split of raw images (use add)");
  if (written_ >= m.options.total_records)
    RT_THROW("ShardWriter: more than the announced ", m.options.total_records, " records for split '", m.options.split,
             "'");
  if (label < 0 || label >= m.options.num_classes)
    RT_THROW("ShardWriter: record ", written_, " has label ", label, " outside [0, ", m.options.num_classes, ")");
  const bool varied = m.options.height == 0;
  const int64_t max_side = format::kMaxVariedSide;
  if (varied ? decoded_hwc[0] < 1 || decoded_hwc[0] > max_side || decoded_hwc[1] < 1 || decoded_hwc[1] > max_side ||
                   decoded_hwc[2] != m.options.channels
             : decoded_hwc[0] != m.options.height || decoded_hwc[1] != m.options.width ||
                   decoded_hwc[2] != m.options.channels)
    RT_THROW("ShardWriter: record ", written_, " decodes to ", decoded_hwc[0], "x", decoded_hwc[1], "x", decoded_hwc[2],
             ", the split's images are ",
             varied ? detail::str_cat("of varied sizes (1 to ", max_side, " pixels a side) with ", m.options.channels,
                                      " channels")
                    : detail::str_cat(m.options.height, "x", m.options.width, "x", m.options.channels));
  RT_CHECK(static_cast<int64_t>(channel_sums.size()) == m.options.channels &&
               static_cast<int64_t>(channel_squares.size()) == m.options.channels,
           "ShardWriter::add_encoded: channel sums must have one entry per channel");
  RT_CHECK(!bytes.empty(), "ShardWriter: record ", written_, " of split '", m.options.split, "' has no encoded bytes");
  m.start_record(written_);
  m.pending.insert(m.pending.end(), bytes.begin(), bytes.end());
  m.offsets.push_back(m.offsets.back() + static_cast<int64_t>(bytes.size()));
  if (m.pending.size() >= 4 * kEncodedChunkBytes) m.flush_encoded();
  m.labels.push_back(label);
  for (int k = 0; k < 3; ++k) m.shapes.push_back(static_cast<int32_t>(decoded_hwc[k]));
  m.pixels += static_cast<double>(decoded_hwc[0]) * static_cast<double>(decoded_hwc[1]);
  for (size_t c = 0; c < channel_sums.size(); ++c) {
    m.sums[c] += channel_sums[c];
    m.squares[c] += channel_squares[c];
  }
  ++written_;
  if (m.options.show_progress) m.progress(written_);
}

SplitInfo ShardWriter::finish() {
  auto& m = *impl_;
  const auto& o = m.options;
  if (written_ != o.total_records)
    RT_THROW("ShardWriter: split '", o.split, "' announced ", o.total_records, " records but got ", written_);
  m.close_shard();  // then every remaining (empty) shard is created below, even for an empty split
  for (int s = static_cast<int>(m.shards.size()); s < o.num_shards; ++s) {
    m.open_shard(s);
    m.close_shard();
  }
  SplitInfo info;
  info.split = o.split;
  info.records = o.total_records;
  info.height = o.height;
  info.width = o.width;
  info.channels = o.channels;
  info.encoded = o.encoded;
  info.num_classes = o.num_classes;
  info.classes = o.classes;
  info.source = o.source;
  info.segmentation = o.segmentation;
  const double pixels = std::max(1.0, m.pixels);
  for (int64_t c = 0; c < o.channels; ++c) {
    const double mean = m.sums[static_cast<size_t>(c)] / pixels;
    const double var = std::max(0.0, m.squares[static_cast<size_t>(c)] / pixels - mean * mean);
    info.mean.push_back(static_cast<float>(mean));
    // A constant channel (or an empty split) has no spread to divide by: 1 leaves it as x/255 - mean,
    // and readers refuse a std of 0 or below.
    const float std = static_cast<float>(std::sqrt(var));
    info.std.push_back(std > 0 ? std : 1.0f);
  }
  // Attributes, then checksum, then rename: a crash never leaves a final-named partial shard.
  for (int s = 0; s < o.num_shards; ++s) {
    const fs::path tmp = m.temp_path(s);
    {
      std::lock_guard<std::recursive_mutex> lock(h5::lock());
      h5::Id file(check(H5Fopen(tmp.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), tmp, "", "reopen"), H5Fclose);
      const h5::Where at = format::shard_at(tmp);
      h5::write_string_attribute(file, "format", kFormatName, at);
      h5::write_int_attribute(file, "format_version", {info.format_version()}, at);
      h5::write_string_attribute(file, "split", o.split, at);
      h5::write_int_attribute(file, "num_classes", {o.num_classes}, at);
      h5::write_float_attribute(file, "mean", info.mean, at);
      h5::write_float_attribute(file, "std", info.std, at);
      h5::write_string_attribute(file, "source", o.source, at);
      h5::write_int_attribute(file, "shard_index", {s}, at);
      h5::write_int_attribute(file, "num_shards", {o.num_shards}, at);
      if (o.segmentation) {
        h5::write_string_attribute(file, "task", "segmentation", at);
        h5::write_int_attribute(file, "ignore_index", {info.ignore_index}, at);
      }
      check(H5Fflush(file, H5F_SCOPE_GLOBAL), tmp, "", "flush");
    }
    m.shards[static_cast<size_t>(s)].crc32 = file_crc32(tmp);
  }
  // Stale shards of this split from an earlier run with another shard count would confuse readers.
  for (const auto& entry : fs::directory_iterator(o.dir)) {
    if (format::is_shard_file_of(entry.path().filename().string(), o.split)) fs::remove(entry.path());
  }
  for (int s = 0; s < o.num_shards; ++s) fs::rename(m.temp_path(s), o.dir / m.shards[static_cast<size_t>(s)].file);
  m.temp_files.clear();
  info.shards = m.shards;

  format::write_manifest_split(o.dir, o.source, info);
  m.finished = true;
  ShardDataset::open(o.dir, o.split, {.allow_empty = true});  // validates what we wrote
  return info;
}

}  // namespace ringtrain::data
