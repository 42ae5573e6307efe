// data/shard_dataset.cpp: ShardDataset — every shard validated against the manifest on open (checksum,
// attributes, dtypes, shapes, counts, labels), then records read by global index under the HDF5 lock.
#include <hdf5.h>

#include <algorithm>
#include <list>
#include <set>

#include "core/check.h"
#include "data/codec.h"
#include "data/shard_format.h"

namespace ringtrain::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

using format::check;

struct ShardDataset::Impl {
  fs::path dir;
  std::vector<int64_t> begin;  // global index of each shard's first record (size shards + 1)
  int64_t chunk = 1;
  std::vector<int32_t> labels;  // every label of the split, read once at open (4 bytes per record)
  // Open shards (file + image dataset), at most kMaxOpen at once (least recently used closed first).
  static constexpr size_t kMaxOpen = 64;
  struct Open {
    hid_t file = H5I_INVALID_HID, images = H5I_INVALID_HID;
  };
  std::vector<Open> open;
  std::list<int> lru;

  ~Impl() {
    std::lock_guard<std::recursive_mutex> lock(h5::lock());
    for (auto& o : open) close(o);
  }

  static void close(Open& o) {
    // Closing a read-only file cannot lose data; a failure is reported by the handle and otherwise ignored.
    h5::Id(o.images, H5Dclose).reset();
    h5::Id(o.file, H5Fclose).reset();
    o = Open{};
  }

  // The image dataset (/images or /jpeg) of a shard, opening it if needed. Caller holds hdf5_mutex().
  hid_t images(int shard, const SplitInfo& info) {
    Open& o = open[static_cast<size_t>(shard)];
    lru.remove(shard);
    lru.push_front(shard);
    if (o.images >= 0) return o.images;
    if (lru.size() > kMaxOpen) {
      const int victim = lru.back();
      lru.pop_back();
      close(open[static_cast<size_t>(victim)]);
    }
    const fs::path path = dir / info.shards[static_cast<size_t>(shard)].file;
    const char* name = info.encoded ? "/jpeg" : "/images";
    // Opened into locals and stored only when both succeed, so a failure leaks no handle.
    h5::Id file(check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path, "", "cannot open"), H5Fclose);
    const hid_t images = H5Dopen2(file, name, H5P_DEFAULT);
    if (images < 0) {
      lru.remove(shard);
      check(images, path, name, "cannot open dataset");
    }
    o.file = file.release();
    o.images = images;
    return o.images;
  }
};

namespace {

// Validates one shard file against the manifest entry; throws naming file and object. Appends the shard's
// labels to `all_labels`.
void validate_shard(const fs::path& path, const SplitInfo& info, size_t index, bool check_labels,
                    std::vector<int32_t>& all_labels) {
  const ShardInfo& shard = info.shards[index];
  detail::h5_silence_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0)
    RT_THROW("shard '", path.string(), "' is truncated or not an HDF5 file (HDF5: ", detail::h5_error_text(), ")");
  const h5::Where at = format::shard_at(path);
  h5::Id file(check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path, "", "truncated or corrupt file, cannot open"),
              H5Fclose);
  const std::string format = h5::read_string_attribute(file, "format", at);
  if (format != kFormatName) RT_THROW("shard '", path.string(), "': attribute 'format' is '", format, "', expected '", kFormatName, "'");
  const auto version = h5::read_int_attribute(file, "format_version", at);
  if (version.size() != 1 || version[0] != kFormatVersion)
    RT_THROW("shard '", path.string(), "': format_version ", version.empty() ? -1 : version[0], ", expected ", kFormatVersion);
  const auto classes = h5::read_int_attribute(file, "num_classes", at);
  if (classes.size() != 1 || classes[0] != info.num_classes)
    RT_THROW("shard '", path.string(), "': num_classes ", classes.empty() ? -1 : classes[0],
             " disagrees with the manifest's ", info.num_classes);
  // The shard's own idea of where it belongs must match the manifest's (a file copied between datasets or
  // renamed would otherwise read as part of the wrong split).
  const std::string split = h5::read_string_attribute(file, "split", at);
  if (split != info.split)
    RT_THROW("shard '", path.string(), "': attribute 'split' is '", split, "' but the manifest lists it in split '",
             info.split, "'");
  const auto shard_index = h5::read_int_attribute(file, "shard_index", at);
  const auto num_shards = h5::read_int_attribute(file, "num_shards", at);
  if (shard_index.size() != 1 || num_shards.size() != 1 || shard_index[0] != static_cast<int64_t>(index) ||
      num_shards[0] != static_cast<int64_t>(info.shards.size()))
    RT_THROW("shard '", path.string(), "': attributes say shard ", shard_index.empty() ? -1 : shard_index[0], " of ",
             num_shards.empty() ? -1 : num_shards[0], " but the manifest lists it as shard ", index, " of ",
             info.shards.size());

  const char* image_name = info.encoded ? "jpeg" : "images";
  const std::string image_object = std::string("/") + image_name;
  if (!h5::link_exists(file, image_name, at)) RT_THROW("shard '", path.string(), "': missing dataset '", image_object, "'");
  if (!h5::link_exists(file, "labels", at)) RT_THROW("shard '", path.string(), "': missing dataset '/labels'");
  const h5::Where iat = at.at(image_object);
  h5::Id images(check(H5Dopen2(file, image_name, H5P_DEFAULT), path, image_object, "cannot open dataset"), H5Dclose);
  h5::Id itype(check(H5Dget_type(images), path, image_object, "cannot read the type"), H5Tclose);
  const H5T_class_t iclass = h5::check(H5Tget_class(itype), iat, "cannot read the type class");
  const std::vector<hsize_t> idims = h5::dims(images, iat);
  if (!info.encoded) {
    if (iclass != H5T_INTEGER || H5Tget_size(itype) != 1 || H5Tget_sign(itype) != H5T_SGN_NONE)
      RT_THROW("shard '", path.string(), "': dataset '/images' must be uint8");
    if (idims.size() != 4)
      RT_THROW("shard '", path.string(), "': dataset '/images' has rank ", idims.size(), ", expected 4 (N x H x W x C)");
    if (static_cast<int64_t>(idims[1]) != info.height || static_cast<int64_t>(idims[2]) != info.width ||
        static_cast<int64_t>(idims[3]) != info.channels)
      RT_THROW("shard '", path.string(), "': dataset '/images' holds ", idims[1], "x", idims[2], "x", idims[3],
               " images but the split's images are ", info.height, "x", info.width, "x", info.channels);
  } else {
    if (iclass != H5T_VLEN) RT_THROW("shard '", path.string(), "': dataset '/jpeg' must be variable-length uint8");
    if (idims.size() != 1) RT_THROW("shard '", path.string(), "': dataset '/jpeg' has rank ", idims.size(), ", expected 1");
  }
  if (static_cast<int64_t>(idims[0]) != shard.records)
    RT_THROW("shard '", path.string(), "': dataset '", image_object, "' has ", idims[0], " records, the manifest says ",
             shard.records);

  const h5::Where lat = at.at("/labels");
  h5::Id labels(check(H5Dopen2(file, "labels", H5P_DEFAULT), path, "/labels", "cannot open dataset"), H5Dclose);
  h5::Id ltype(check(H5Dget_type(labels), path, "/labels", "cannot read the type"), H5Tclose);
  if (h5::check(H5Tget_class(ltype), lat, "cannot read the type class") != H5T_INTEGER || H5Tget_size(ltype) != 4 ||
      H5Tget_sign(ltype) != H5T_SGN_2)
    RT_THROW("shard '", path.string(), "': dataset '/labels' must be int32");
  const std::vector<hsize_t> ldims = h5::dims(labels, lat);
  if (ldims.size() != 1) RT_THROW("shard '", path.string(), "': dataset '/labels' has rank ", ldims.size(), ", expected 1");
  if (ldims[0] != idims[0])
    RT_THROW("shard '", path.string(), "': ", idims[0], " images but ", ldims[0], " labels in dataset '/labels'");
  std::vector<int32_t> values(ldims[0]);
  if (ldims[0] > 0)
    check(H5Dread(labels, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), path, "/labels",
          "truncated or corrupt data, cannot read");
  if (check_labels) {
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i] < 0 || values[i] >= info.num_classes)
        RT_THROW("shard '", path.string(), "': dataset '/labels' record ", i, " has label ", values[i], " outside [0, ",
                 info.num_classes, ")");
  }
  all_labels.insert(all_labels.end(), values.begin(), values.end());
}

}  // namespace

ShardDataset ShardDataset::open(const fs::path& dir, const std::string& split, OpenOptions options) {
  std::lock_guard<std::recursive_mutex> lock(h5::lock());
  detail::h5_silence_errors();
  json manifest = format::load_manifest_json(dir);
  const fs::path manifest_path = dir / "manifest.json";
  if (!manifest.contains("splits") || !manifest["splits"].contains(split)) {
    std::string available;
    if (manifest.contains("splits"))
      for (auto& [name, v] : manifest["splits"].items()) available += (available.empty() ? "" : ", ") + name;
    RT_THROW("manifest '", manifest_path.string(), "' has no split '", split, "' (it has: ",
             available.empty() ? "none" : available, ")");
  }
  ShardDataset ds;
  ds.info_ = format::split_from_json(split, manifest["splits"][split], manifest_path);
  const SplitInfo& info = ds.info_;
  if (info.records == 0 && !options.allow_empty)
    RT_THROW("manifest '", manifest_path.string(), "': split '", split, "' has no records");
  int64_t total = 0;
  std::set<std::string> listed;
  std::vector<int32_t> labels;
  for (size_t i = 0; i < info.shards.size(); ++i) {
    const ShardInfo& shard = info.shards[i];
    listed.insert(shard.file);
    const fs::path path = dir / shard.file;
    if (!fs::exists(path)) RT_THROW("shard '", path.string(), "' listed in '", manifest_path.string(), "' is missing");
    if (options.verify_checksums) {
      const uint32_t crc = file_crc32(path);
      if (crc != shard.crc32)
        RT_THROW("shard '", path.string(), "' is corrupt: CRC-32 ", format::hex32(crc), " but the manifest says ",
                 format::hex32(shard.crc32));
    }
    validate_shard(path, info, i, options.check_labels, labels);
    total += shard.records;
  }
  if (total != info.records)
    RT_THROW("manifest '", manifest_path.string(), "': split '", split, "' says ", info.records,
             " records but its shards hold ", total);
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (format::is_shard_file_of(name, split) && !listed.count(name))
      RT_THROW("shard '", entry.path().string(), "' is not listed in '", manifest_path.string(),
               "' (the manifest disagrees with the files; rewrite the split with make_shards)");
  }
  ds.impl_ = new Impl;
  ds.impl_->dir = dir;
  ds.impl_->begin.push_back(0);
  for (const auto& shard : info.shards) ds.impl_->begin.push_back(ds.impl_->begin.back() + shard.records);
  ds.impl_->open.assign(info.shards.size(), Impl::Open{});
  ds.impl_->labels = std::move(labels);
  ds.impl_->chunk = chunk_records_for(info.record_bytes());
  return ds;
}

ShardDataset::ShardDataset(ShardDataset&& o) noexcept : info_(std::move(o.info_)), impl_(o.impl_) { o.impl_ = nullptr; }
ShardDataset& ShardDataset::operator=(ShardDataset&& o) noexcept {
  std::swap(info_, o.info_);
  std::swap(impl_, o.impl_);
  return *this;
}
ShardDataset::~ShardDataset() { delete impl_; }

int64_t ShardDataset::chunk_records() const { return impl_->chunk; }

std::pair<int, int64_t> ShardDataset::locate(int64_t index) const {
  if (index < 0 || index >= info_.records)
    RT_THROW("record ", index, " is out of range for split '", info_.split, "' of ", info_.records, " records");
  const auto& b = impl_->begin;
  const int shard = static_cast<int>(std::upper_bound(b.begin(), b.end(), index) - b.begin()) - 1;
  return {shard, index - b[static_cast<size_t>(shard)]};
}

std::vector<uint8_t> ShardDataset::read_encoded(int64_t index, int32_t* label) const {
  RT_CHECK(info_.encoded, "read_encoded on split '", info_.split, "' which stores decoded images");
  auto [shard, local] = locate(index);
  if (label) *label = impl_->labels[static_cast<size_t>(index)];
  std::lock_guard<std::recursive_mutex> lock(h5::lock());
  const fs::path path = impl_->dir / info_.shards[static_cast<size_t>(shard)].file;
  hid_t ds = impl_->images(shard, info_);
  hsize_t start[1] = {static_cast<hsize_t>(local)}, count[1] = {1};
  h5::Id fspace(check(H5Dget_space(ds), path, "/jpeg", "no dataspace"), H5Sclose);
  check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr), path, "/jpeg", "select record");
  h5::Id mspace(check(H5Screate_simple(1, count, nullptr), path, "/jpeg", "create dataspace"), H5Sclose);
  h5::Id vlen(check(H5Tvlen_create(H5T_NATIVE_UINT8), path, "/jpeg", "create type"), H5Tclose);
  hvl_t value{0, nullptr};
  check(H5Dread(ds, vlen, mspace, fspace, H5P_DEFAULT, &value), path, "/jpeg", "truncated or corrupt record");
  std::vector<uint8_t> bytes(static_cast<const uint8_t*>(value.p), static_cast<const uint8_t*>(value.p) + value.len);
  check(H5Dvlen_reclaim(vlen, mspace, H5P_DEFAULT, &value), path, "/jpeg", "release the record's memory");
  return bytes;
}

void ShardDataset::read_range(int64_t begin, int64_t count, uint8_t* images, int32_t* labels) const {
  if (count <= 0) return;
  if (begin < 0 || begin + count > info_.records)
    RT_THROW("records [", begin, ", ", begin + count, ") are out of range for split '", info_.split, "' of ",
             info_.records, " records");
  const int64_t record_bytes = info_.record_bytes();
  if (info_.encoded) {
    for (int64_t i = 0; i < count; ++i) {
      int32_t label = 0;
      std::vector<uint8_t> bytes = read_encoded(begin + i, &label);
      DecodedImage img;
      try {
        img = decode_image(bytes.data(), bytes.size());
      } catch (const Error& e) {
        auto [shard, local] = locate(begin + i);
        RT_THROW("shard '", (impl_->dir / info_.shards[static_cast<size_t>(shard)].file).string(), "', '/jpeg' record ",
                 local, ": ", e.what());
      }
      if (img.height != info_.height || img.width != info_.width || img.channels != info_.channels)
        RT_THROW("split '", info_.split, "' record ", begin + i, " decodes to ", img.height, "x", img.width, "x",
                 img.channels, ", expected ", info_.height, "x", info_.width, "x", info_.channels);
      std::copy(img.pixels.begin(), img.pixels.end(), images + i * record_bytes);
      if (labels) labels[i] = label;
    }
    return;
  }
  if (labels) std::copy_n(impl_->labels.data() + begin, count, labels);
  std::lock_guard<std::recursive_mutex> lock(h5::lock());
  int64_t done = 0;
  while (done < count) {
    auto [shard, local] = locate(begin + done);
    const int64_t in_shard = std::min(count - done, info_.shards[static_cast<size_t>(shard)].records - local);
    const fs::path path = impl_->dir / info_.shards[static_cast<size_t>(shard)].file;
    hid_t ds = impl_->images(shard, info_);
    hsize_t start[4] = {static_cast<hsize_t>(local), 0, 0, 0};
    hsize_t counts[4] = {static_cast<hsize_t>(in_shard), static_cast<hsize_t>(info_.height),
                         static_cast<hsize_t>(info_.width), static_cast<hsize_t>(info_.channels)};
    h5::Id fspace(check(H5Dget_space(ds), path, "/images", "no dataspace"), H5Sclose);
    check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, counts, nullptr), path, "/images", "select records");
    h5::Id mspace(check(H5Screate_simple(4, counts, nullptr), path, "/images", "create dataspace"), H5Sclose);
    check(H5Dread(ds, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, images + done * record_bytes), path,
                "/images", "truncated or corrupt data, cannot read records");
    done += in_shard;
  }
}

void ShardDataset::read_indices(const std::vector<int64_t>& indices, uint8_t* images, int32_t* labels) const {
  const int64_t record_bytes = info_.record_bytes();
  // Visit in sorted order, reading contiguous runs at once, then scatter to the requested positions.
  std::vector<size_t> order(indices.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return indices[a] < indices[b]; });
  // A gap of up to max_gap unwanted records is read through: one larger HDF5 read beats many small ones.
  const int64_t max_gap = info_.encoded ? 0 : std::max<int64_t>(0, (256 << 10) / std::max<int64_t>(1, record_bytes));
  std::vector<uint8_t> run_images;
  size_t i = 0;
  while (i < order.size()) {
    size_t j = i + 1;
    while (j < order.size() && indices[order[j]] - indices[order[j - 1]] <= max_gap + 1) ++j;
    const int64_t first = indices[order[i]], span = indices[order[j - 1]] - first + 1;
    run_images.resize(static_cast<size_t>(span * record_bytes));
    read_range(first, span, run_images.data(), nullptr);
    for (size_t k = i; k < j; ++k) {
      const size_t at = order[k];
      const int64_t offset = indices[at] - first;
      std::copy_n(run_images.data() + offset * record_bytes, record_bytes, images + at * static_cast<size_t>(record_bytes));
      if (labels) labels[at] = impl_->labels[static_cast<size_t>(indices[at])];
    }
    i = j;
  }
}

}  // namespace ringtrain::data
