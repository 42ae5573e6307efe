// data/shard_dataset.cpp: ShardDataset — every shard validated against the manifest on open (checksum,
// attributes, dtypes, shapes, counts, labels), then records read by global index. Decoded images and
// version 2 encoded records are read with pread at byte offsets HDF5 gave at open (its chunk index), so
// reading takes no library lock and threads scale; version 1 encoded records go through HDF5, under its lock.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <set>

#include "core/check.h"
#include "data/codec.h"
#include "data/shard_format.h"
#include "io/files.h"

namespace ringtrain::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

using format::check;

namespace {

// Where a dataset's bytes lie in its file: chunk k holds rows [k * rows, (k + 1) * rows) of its first
// dimension at addr[k], unfiltered, row-major, so row r of a chunk starts at addr[k] + r * row_bytes.
// (/images: a row is a record; /encoded: a row is a byte.)
struct DirectLayout {
  bool usable = false;  // false: read through HDF5 (a layout pread cannot serve)
  int64_t rows = 0;
  std::vector<uint64_t> addr;
};

// What open learned about a shard's image data.
struct ShardLayout {
  int version = kFormatVersion;
  const char* object = "/images";  // "/images", "/encoded" (v2) or "/jpeg" (v1)
  DirectLayout direct;
  std::vector<int64_t> offsets;  // v2 encoded: record i is bytes [offsets[i], offsets[i + 1]) of /encoded
  std::vector<int32_t> shapes;   // varied-size splits: H, W, C of each record (from /shapes)
  DirectLayout masks;            // segmentation splits: where /masks lies (read through HDF5 when unusable)
};

// A read-only descriptor, closed when the last reader lets go of it.
struct FileFd {
  int fd = -1;
  ~FileFd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

struct ShardDataset::Impl {
  fs::path dir;
  bool direct_reads = true;
  std::vector<ShardLayout> layout;  // per shard
  // Descriptors for pread, opened on first use, at most kMaxOpen at once (least recently used dropped;
  // a reader still using a dropped one keeps it alive). fd_mutex guards the table only, never a read.
  std::mutex fd_mutex;
  std::vector<std::shared_ptr<FileFd>> fds;
  std::list<int> fd_lru;
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
    const char* name = layout[static_cast<size_t>(shard)].object;
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

  std::shared_ptr<FileFd> fd_of(int shard, const SplitInfo& info) {
    std::lock_guard<std::mutex> lock(fd_mutex);
    auto& slot = fds[static_cast<size_t>(shard)];
    fd_lru.remove(shard);
    fd_lru.push_front(shard);
    if (slot) return slot;
    if (fd_lru.size() > kMaxOpen) {
      fds[static_cast<size_t>(fd_lru.back())].reset();
      fd_lru.pop_back();
    }
    const fs::path path = dir / info.shards[static_cast<size_t>(shard)].file;
    auto f = std::make_shared<FileFd>();
    f->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
      fd_lru.remove(shard);
      RT_THROW("shard '", path.string(), "': cannot open for reading: ", std::strerror(errno));
    }
    slot = f;
    return slot;
  }

  bool direct(int shard) const { return direct_reads && layout[static_cast<size_t>(shard)].direct.usable; }

  // Rows [local, local + count) of a shard's image dataset with a usable direct layout, into out; errors
  // name `record` (-1: the row is the record).
  void read_direct(int shard, int64_t local, int64_t count, int64_t row_bytes, const SplitInfo& info, uint8_t* out,
                   int64_t record = -1) {
    const ShardLayout& sl = layout[static_cast<size_t>(shard)];
    read_direct_from(sl.direct, sl.object, shard, local, count, row_bytes, info, out, record);
  }

  // The same from any dataset whose layout open resolved (/masks).
  void read_direct_from(const DirectLayout& d, const char* object, int shard, int64_t local, int64_t count,
                        int64_t row_bytes, const SplitInfo& info, uint8_t* out, int64_t record = -1) {
    const std::shared_ptr<FileFd> f = fd_of(shard, info);
    while (count > 0) {
      const int64_t k = local / d.rows, r = local % d.rows, n = std::min(count, d.rows - r);
      uint64_t at = d.addr[static_cast<size_t>(k)] + static_cast<uint64_t>(r * row_bytes);
      size_t left = static_cast<size_t>(n * row_bytes);
      while (left > 0) {
        const ssize_t got = ::pread(f->fd, out, left, static_cast<off_t>(at));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
          RT_THROW("shard '", (dir / info.shards[static_cast<size_t>(shard)].file).string(), "': '", object,
                   "' record ", record >= 0 ? record : local, ": ",
                   got < 0 ? std::strerror(errno) : "the file ends before the record (truncated)");
        out += got;
        at += static_cast<uint64_t>(got);
        left -= static_cast<size_t>(got);
      }
      local += n;
      count -= n;
    }
  }
};

namespace {

// The byte ranges of /images in its file, from HDF5's own index, checked against the file's size: a record
// said to lie past the end is an error naming the file and the record, before any read. A layout that
// pread cannot serve (filtered chunks, unallocated chunks, a compact dataset) is read through HDF5 instead.
// rows: the dataset's first dimension; row_bytes and inner: one row's bytes and its other dimensions.
DirectLayout resolve_direct(const fs::path& path, hid_t file, hid_t images, const std::string& object, int64_t records,
                            int64_t rb, const std::vector<hsize_t>& inner) {
  DirectLayout d;
  if (records == 0) return d;
  const int rank = 1 + static_cast<int>(inner.size());
  h5::Id fcpl(check(H5Fget_create_plist(file), path, "", "cannot read the creation properties"), H5Pclose);
  hsize_t userblock = 0;
  check(H5Pget_userblock(fcpl, &userblock), path, "", "cannot read the user block size");
  h5::Id dcpl(check(H5Dget_create_plist(images), path, object, "cannot read the creation properties"), H5Pclose);
  if (H5Pget_nfilters(dcpl) != 0) return d;
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_CONTIGUOUS) {
    const haddr_t a = H5Dget_offset(images);
    if (a == HADDR_UNDEF) return d;
    d.rows = records;
    d.addr = {userblock + a};
  } else if (layout == H5D_CHUNKED) {
    hsize_t cdims[4] = {};
    if (rank > 4 || H5Pget_chunk(dcpl, rank, cdims) != rank || cdims[0] == 0 ||
        !std::equal(inner.begin(), inner.end(), cdims + 1))
      return d;
    d.rows = static_cast<int64_t>(cdims[0]);
    const int64_t chunks = (records + d.rows - 1) / d.rows;
    h5::Id space(check(H5Dget_space(images), path, object, "no dataspace"), H5Sclose);
    hsize_t n = 0;
    check(H5Dget_num_chunks(images, space, &n), path, object, "cannot count the chunks");
    if (static_cast<int64_t>(n) != chunks) return d;  // some never written: HDF5 fills them
    d.addr.assign(static_cast<size_t>(chunks), HADDR_UNDEF);
    for (hsize_t i = 0; i < n; ++i) {
      hsize_t coord[4] = {};
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      check(H5Dget_chunk_info(images, space, i, coord, &mask, &addr, &size), path, object,
            "cannot read the chunk index");
      const int64_t k = static_cast<int64_t>(coord[0]) / d.rows;
      if (mask != 0 || addr == HADDR_UNDEF || static_cast<int64_t>(size) != d.rows * rb || k >= chunks)
        return DirectLayout{};
      d.addr[static_cast<size_t>(k)] = userblock + addr;
    }
  } else {
    return d;
  }
  std::error_code ec;
  const uint64_t file_bytes = fs::file_size(path, ec);
  if (ec) RT_THROW("shard '", path.string(), "': cannot read its size: ", ec.message());
  for (size_t k = 0; k < d.addr.size(); ++k) {
    const int64_t first = static_cast<int64_t>(k) * d.rows, rows = std::min(d.rows, records - first);
    if (d.addr[k] + static_cast<uint64_t>(rows * rb) > file_bytes)
      RT_THROW("shard '", path.string(), "': '", object, "' ", rb == 1 ? "bytes " : "records ", first, "-",
               first + rows - 1, " lie at file bytes ", d.addr[k], "-", d.addr[k] + static_cast<uint64_t>(rows * rb),
               " but the file has ", file_bytes, " bytes: the shard is truncated");
  }
  d.usable = true;
  return d;
}

// One dataset of a shard, opened with its type and shape. Errors name the file and the object.
struct Dataset {
  std::string object;  // "/labels"
  h5::Id id, type;
  H5T_class_t type_class = H5T_NO_CLASS;
  std::vector<hsize_t> dims;
  bool is(H5T_class_t c, size_t bytes) const { return type_class == c && H5Tget_size(type) == bytes; }
  bool is_unsigned() const { return H5Tget_sign(type) == H5T_SGN_NONE; }
};

Dataset open_dataset(const fs::path& path, hid_t file, const std::string& object) {
  const h5::Where at = format::shard_at(path, object);
  if (!h5::link_exists(file, object.c_str() + 1, format::shard_at(path)))
    RT_THROW("shard '", path.string(), "': missing dataset '", object, "'");
  Dataset d;
  d.object = object;
  d.id = h5::Id(check(H5Dopen2(file, object.c_str() + 1, H5P_DEFAULT), path, object, "cannot open dataset"), H5Dclose);
  d.type = h5::Id(check(H5Dget_type(d.id), path, object, "cannot read the type"), H5Tclose);
  d.type_class = h5::check(H5Tget_class(d.type), at, "cannot read the type class");
  d.dims = h5::dims(d.id, at);
  return d;
}

// The whole of a 1-D or 2-D dataset (its size checked by the caller).
template <typename T>
std::vector<T> read_all(const fs::path& path, const Dataset& d, hid_t mem_type, size_t count) {
  std::vector<T> values(count);
  if (count > 0)
    check(H5Dread(d.id, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), path, d.object,
          "truncated or corrupt data, cannot read");
  return values;
}

// The shard's attributes against the manifest: format and version, classes, and its own idea of where it
// belongs (a file copied between datasets or renamed would otherwise read as part of the wrong split).
// Returns the format version.
int check_attributes(const fs::path& path, hid_t file, const SplitInfo& info, size_t index) {
  const h5::Where at = format::shard_at(path);
  const std::string format = h5::read_string_attribute(file, "format", at);
  if (format != kFormatName)
    RT_THROW("shard '", path.string(), "': attribute 'format' is '", format, "', expected '", kFormatName, "'");
  const auto version = h5::read_int_attribute(file, "format_version", at);
  if (version.size() != 1 || version[0] < kOldestReadableFormatVersion || version[0] > kFormatVersion)
    RT_THROW("shard '", path.string(), "': format_version ", version.empty() ? -1 : version[0], ", expected ",
             kOldestReadableFormatVersion, " to ", kFormatVersion);
  const auto classes = h5::read_int_attribute(file, "num_classes", at);
  if (classes.size() != 1 || classes[0] != info.num_classes)
    RT_THROW("shard '", path.string(), "': num_classes ", classes.empty() ? -1 : classes[0],
             " disagrees with the manifest's ", info.num_classes);
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
  return static_cast<int>(version[0]);
}

// Decoded images (/images): N x H x W x C uint8 of the split's shape. Returns N.
int64_t check_decoded_images(const fs::path& path, const Dataset& images, const SplitInfo& info) {
  const auto& d = images.dims;
  if (!images.is(H5T_INTEGER, 1) || !images.is_unsigned())
    RT_THROW("shard '", path.string(), "': dataset '/images' must be uint8");
  if (d.size() != 4)
    RT_THROW("shard '", path.string(), "': dataset '/images' has rank ", d.size(), ", expected 4 (N x H x W x C)");
  if (static_cast<int64_t>(d[1]) != info.height || static_cast<int64_t>(d[2]) != info.width ||
      static_cast<int64_t>(d[3]) != info.channels)
    RT_THROW("shard '", path.string(), "': dataset '/images' holds ", d[1], "x", d[2], "x", d[3],
             " images but the split's images are ", info.height, "x", info.width, "x", info.channels);
  return static_cast<int64_t>(d[0]);
}

// Version 1 encoded images (/jpeg): one variable-length record each. Returns their count.
int64_t check_vlen_images(const fs::path& path, const Dataset& images) {
  if (images.type_class != H5T_VLEN)
    RT_THROW("shard '", path.string(), "': dataset '/jpeg' must be variable-length uint8");
  if (images.dims.size() != 1)
    RT_THROW("shard '", path.string(), "': dataset '/jpeg' has rank ", images.dims.size(), ", expected 1");
  return static_cast<int64_t>(images.dims[0]);
}

// Version 2+ encoded images: the bytes back to back in /encoded, and /offsets, checked whole, so a bad offset
// is an error naming the record before any read. Returns the offsets (records + 1 entries).
std::vector<int64_t> check_encoded_images(const fs::path& path, hid_t file, const Dataset& encoded, int64_t records) {
  if (!encoded.is(H5T_INTEGER, 1) || !encoded.is_unsigned() || encoded.dims.size() != 1)
    RT_THROW("shard '", path.string(), "': dataset '/encoded' must be 1-D uint8");
  const auto bytes = static_cast<int64_t>(encoded.dims[0]);
  const Dataset offsets = open_dataset(path, file, "/offsets");
  if (!offsets.is(H5T_INTEGER, 8) || offsets.dims.size() != 1)
    RT_THROW("shard '", path.string(), "': dataset '/offsets' must be 1-D int64");
  if (static_cast<int64_t>(offsets.dims[0]) != records + 1)
    RT_THROW("shard '", path.string(), "': dataset '/offsets' has ", offsets.dims[0], " entries, expected ",
             records + 1, " (one per record of the manifest, then the end)");
  const std::vector<int64_t> o = read_all<int64_t>(path, offsets, H5T_NATIVE_INT64, offsets.dims[0]);
  if (o[0] != 0) RT_THROW("shard '", path.string(), "': '/offsets' starts at ", o[0], ", expected 0");
  for (size_t r = 0; r + 1 < o.size(); ++r)
    if (o[r + 1] <= o[r] || o[r + 1] > bytes)
      RT_THROW("shard '", path.string(), "': '/encoded' record ", r, " would be bytes [", o[r], ", ", o[r + 1],
               ") of the ", bytes, " bytes of '/encoded' (a corrupt '/offsets')");
  if (o.back() != bytes)
    RT_THROW("shard '", path.string(), "': '/offsets' ends at byte ", o.back(), " but '/encoded' holds ", bytes);
  return o;
}

// /labels: one int32 per record, each in [0, classes) when checked.
std::vector<int32_t> read_labels(const fs::path& path, hid_t file, const SplitInfo& info, int64_t records,
                                 bool check_labels) {
  const Dataset labels = open_dataset(path, file, "/labels");
  if (!labels.is(H5T_INTEGER, 4) || H5Tget_sign(labels.type) != H5T_SGN_2)
    RT_THROW("shard '", path.string(), "': dataset '/labels' must be int32");
  if (labels.dims.size() != 1)
    RT_THROW("shard '", path.string(), "': dataset '/labels' has rank ", labels.dims.size(), ", expected 1");
  if (static_cast<int64_t>(labels.dims[0]) != records)
    RT_THROW("shard '", path.string(), "': ", records, " images but ", labels.dims[0], " labels in dataset '/labels'");
  std::vector<int32_t> values = read_all<int32_t>(path, labels, H5T_NATIVE_INT32, labels.dims[0]);
  if (check_labels)
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i] < 0 || values[i] >= info.num_classes)
        RT_THROW("shard '", path.string(), "': dataset '/labels' record ", i, " has label ", values[i], " outside [0, ",
                 info.num_classes, ")");
  return values;
}

// A varied-size split's /shapes (version 3): H, W, C of each record, checked whole at open like /offsets.
std::vector<int32_t> read_shapes(const fs::path& path, hid_t file, const SplitInfo& info, int version,
                                 int64_t records) {
  if (version < 3)
    RT_THROW("shard '", path.string(), "': format_version ", version, " but the manifest says split '", info.split,
             "' holds images of varied sizes (a version 3 layout)");
  const Dataset shapes = open_dataset(path, file, "/shapes");
  if (!shapes.is(H5T_INTEGER, 4) || shapes.dims.size() != 2 || shapes.dims[1] != 3)
    RT_THROW("shard '", path.string(), "': dataset '/shapes' must be N x 3 int32");
  if (static_cast<int64_t>(shapes.dims[0]) != records)
    RT_THROW("shard '", path.string(), "': dataset '/shapes' has ", shapes.dims[0], " rows for ", records, " records");
  std::vector<int32_t> hwc = read_all<int32_t>(path, shapes, H5T_NATIVE_INT32, static_cast<size_t>(3 * records));
  for (int64_t r = 0; r < records; ++r) {
    const int32_t* s = hwc.data() + 3 * r;
    if (s[0] < 1 || s[0] > format::kMaxVariedSide || s[1] < 1 || s[1] > format::kMaxVariedSide || s[2] != info.channels)
      RT_THROW("shard '", path.string(), "': dataset '/shapes' record ", r, " is ", s[0], "x", s[1], "x", s[2],
               ", expected 1 to ", format::kMaxVariedSide, " pixels a side and ", info.channels, " channels");
  }
  return hwc;
}

// A segmentation split's /masks: (records, H, W) uint8 of the images' size, and the shard's own word that it is one.
// Returns where its bytes lie.
DirectLayout check_masks(const fs::path& path, hid_t file, const SplitInfo& info, int version, int64_t records) {
  const h5::Where at = format::shard_at(path);
  if (version < 4 || !h5::attribute_exists(file, "task", at) ||
      h5::read_string_attribute(file, "task", at) != "segmentation")
    RT_THROW("shard '", path.string(), "': the manifest says split '", info.split,
             "' is a segmentation split but the shard is not one (no 'task' attribute 'segmentation', format_version ",
             version, ")");
  const Dataset masks = open_dataset(path, file, "/masks");
  if (!masks.is(H5T_INTEGER, 1) || !masks.is_unsigned())
    RT_THROW("shard '", path.string(), "': dataset '/masks' must be uint8");
  const auto& d = masks.dims;
  if (d.size() != 3 || static_cast<int64_t>(d[0]) != records || static_cast<int64_t>(d[1]) != info.height ||
      static_cast<int64_t>(d[2]) != info.width)
    RT_THROW("shard '", path.string(), "': dataset '/masks' has rank ", d.size(), " and ",
             d.empty() ? 0 : static_cast<int64_t>(d[0]), " records of ", d.size() > 1 ? static_cast<int64_t>(d[1]) : 0,
             "x", d.size() > 2 ? static_cast<int64_t>(d[2]) : 0, ", expected ", records, " masks of ", info.height, "x",
             info.width, " (one per image, of the images' size)");
  return resolve_direct(path, file, masks.id, "/masks", records, info.mask_bytes(),
                        {static_cast<hsize_t>(info.height), static_cast<hsize_t>(info.width)});
}

// Validates one shard file against the manifest entry; throws naming file and object. Appends the shard's
// labels to `all_labels`; returns where its image data lies.
ShardLayout validate_shard(const fs::path& path, const SplitInfo& info, size_t index, bool check_labels,
                           std::vector<int32_t>& all_labels) {
  const ShardInfo& shard = info.shards[index];
  h5::silence_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0)
    RT_THROW("shard '", path.string(), "' is truncated or not an HDF5 file (HDF5: ", h5::error_text(), ")");
  h5::Id file(
      check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path, "", "truncated or corrupt file, cannot open"),
      H5Fclose);
  ShardLayout layout;
  layout.version = check_attributes(path, file, info, index);
  layout.object = !info.encoded ? "/images" : layout.version == 1 ? "/jpeg" : "/encoded";
  const Dataset images = open_dataset(path, file, layout.object);
  int64_t records = 0;
  if (!info.encoded) {
    records = check_decoded_images(path, images, info);
  } else if (layout.version == 1) {
    records = check_vlen_images(path, images);
  } else {
    layout.offsets = check_encoded_images(path, file, images, shard.records);
    records = static_cast<int64_t>(layout.offsets.size()) - 1;
  }
  if (records != shard.records)
    RT_THROW("shard '", path.string(), "': dataset '", layout.object, "' has ", records, " records, the manifest says ",
             shard.records);
  const std::vector<int32_t> labels = read_labels(path, file, info, records, check_labels);
  all_labels.insert(all_labels.end(), labels.begin(), labels.end());
  if (info.varied_size()) layout.shapes = read_shapes(path, file, info, layout.version, shard.records);
  if (info.segmentation) layout.masks = check_masks(path, file, info, layout.version, shard.records);
  if (!info.encoded)
    layout.direct = resolve_direct(
        path, file, images.id, "/images", shard.records, info.record_bytes(),
        {static_cast<hsize_t>(info.height), static_cast<hsize_t>(info.width), static_cast<hsize_t>(info.channels)});
  else if (layout.version >= 2)
    layout.direct = resolve_direct(path, file, images.id, "/encoded", static_cast<int64_t>(images.dims[0]), 1, {});
  return layout;
}

}  // namespace

ShardDataset ShardDataset::open(const fs::path& dir, const std::string& split, OpenOptions options) {
  std::lock_guard<std::recursive_mutex> lock(h5::lock());
  h5::silence_errors();
  json manifest = format::load_manifest_json(dir);
  const fs::path manifest_path = dir / "manifest.json";
  if (!manifest.contains("splits") || !manifest["splits"].contains(split)) {
    std::string available;
    if (manifest.contains("splits"))
      for (auto& [name, v] : manifest["splits"].items()) available += (available.empty() ? "" : ", ") + name;
    RT_THROW("manifest '", manifest_path.string(), "' has no split '", split,
             "' (it has: ", available.empty() ? "none" : available, ")");
  }
  ShardDataset ds;
  ds.info_ = format::split_from_json(split, manifest["splits"][split], manifest_path);
  const SplitInfo& info = ds.info_;
  if (info.records == 0 && !options.allow_empty)
    RT_THROW("manifest '", manifest_path.string(), "': split '", split, "' has no records");
  int64_t total = 0;
  std::set<std::string> listed;
  std::vector<int32_t> labels;
  std::vector<ShardLayout> layouts;
  for (size_t i = 0; i < info.shards.size(); ++i) {
    const ShardInfo& shard = info.shards[i];
    listed.insert(shard.file);
    const fs::path path = dir / shard.file;
    if (!fs::exists(path)) RT_THROW("shard '", path.string(), "' listed in '", manifest_path.string(), "' is missing");
    io::require_regular_file(path, "shard");  // a folder would checksum as nothing: "CRC-32 00000000"
    if (options.verify_checksums) {
      const uint32_t crc = file_crc32(path);
      if (crc != shard.crc32)
        RT_THROW("shard '", path.string(), "' is corrupt: CRC-32 ", format::hex32(crc), " but the manifest says ",
                 format::hex32(shard.crc32));
    }
    layouts.push_back(validate_shard(path, info, i, options.check_labels, labels));
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
  ds.impl_->direct_reads = options.direct_reads;
  ds.impl_->layout = std::move(layouts);
  ds.impl_->fds.resize(info.shards.size());
  ds.impl_->labels = std::move(labels);
  // Records of varied sizes have no common chunk size to keep together: each is its own unit.
  ds.impl_->chunk = info.varied_size() ? 1 : chunk_records_for(info.record_bytes());
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

int ShardDataset::direct_shards() const {
  if (!impl_->direct_reads) return 0;
  return static_cast<int>(
      std::count_if(impl_->layout.begin(), impl_->layout.end(), [](const ShardLayout& l) { return l.direct.usable; }));
}

std::pair<int, int64_t> ShardDataset::locate(int64_t index) const {
  if (index < 0 || index >= info_.records)
    RT_THROW("record ", index, " is out of range for split '", info_.split, "' of ", info_.records, " records");
  const auto& b = impl_->begin;
  const int shard = static_cast<int>(std::upper_bound(b.begin(), b.end(), index) - b.begin()) - 1;
  return {shard, index - b[static_cast<size_t>(shard)]};
}

std::array<int64_t, 3> ShardDataset::record_shape(int64_t index) const {
  if (!info_.varied_size()) return {info_.height, info_.width, info_.channels};
  auto [shard, local] = locate(index);
  const int32_t* hwc = impl_->layout[static_cast<size_t>(shard)].shapes.data() + 3 * local;
  return {hwc[0], hwc[1], hwc[2]};
}

int32_t ShardDataset::label(int64_t index) const {
  RT_CHECK(index >= 0 && index < info_.records, "record ", index, " is out of range for split '", info_.split, "' of ",
           info_.records, " records");
  return impl_->labels[static_cast<size_t>(index)];
}

std::string ShardDataset::record_name(int64_t index) const {
  auto [shard, local] = locate(index);
  return detail::str_cat("shard '", (impl_->dir / info_.shards[static_cast<size_t>(shard)].file).string(), "', '",
                         impl_->layout[static_cast<size_t>(shard)].object, "' record ", local);
}

std::vector<uint8_t> ShardDataset::read_encoded(int64_t index, int32_t* label) const {
  RT_CHECK(info_.encoded, "read_encoded on split '", info_.split, "' which stores decoded images");
  auto [shard, local] = locate(index);
  if (label) *label = impl_->labels[static_cast<size_t>(index)];
  const ShardLayout& layout = impl_->layout[static_cast<size_t>(shard)];
  if (layout.version >= 2) {
    const int64_t a = layout.offsets[static_cast<size_t>(local)], b = layout.offsets[static_cast<size_t>(local) + 1];
    std::vector<uint8_t> bytes(static_cast<size_t>(b - a));
    if (impl_->direct(shard)) {
      impl_->read_direct(shard, a, b - a, 1, info_, bytes.data(), local);
      return bytes;
    }
    std::lock_guard<std::recursive_mutex> lock(h5::lock());
    const fs::path path = impl_->dir / info_.shards[static_cast<size_t>(shard)].file;
    hid_t ds = impl_->images(shard, info_);
    hsize_t start[1] = {static_cast<hsize_t>(a)}, count[1] = {static_cast<hsize_t>(b - a)};
    h5::Id fspace(check(H5Dget_space(ds), path, "/encoded", "no dataspace"), H5Sclose);
    check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr), path, "/encoded",
          "select record");
    h5::Id mspace(check(H5Screate_simple(1, count, nullptr), path, "/encoded", "create dataspace"), H5Sclose);
    check(H5Dread(ds, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, bytes.data()), path, "/encoded",
          detail::str_cat("truncated or corrupt data, cannot read record ", local));
    return bytes;
  }
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
  if (info_.varied_size())
    RT_THROW("split '", info_.split, "' holds encoded images of varied sizes, which have no common shape to read them ",
             "into: read_encoded() and decode them one by one (the loader does, under a random-resized crop)");
  const int64_t record_bytes = info_.record_bytes();
  if (info_.encoded) {
    for (int64_t i = 0; i < count; ++i) {
      int32_t label = 0;
      std::vector<uint8_t> bytes = read_encoded(begin + i, &label);
      DecodedImage img;
      try {
        img = decode_image(bytes.data(), bytes.size());
      } catch (const Error& e) {
        RT_THROW(record_name(begin + i), ": ", e.what());
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
  int64_t done = 0;
  while (done < count) {
    auto [shard, local] = locate(begin + done);
    const int64_t in_shard = std::min(count - done, info_.shards[static_cast<size_t>(shard)].records - local);
    if (impl_->direct(shard)) {
      impl_->read_direct(shard, local, in_shard, record_bytes, info_, images + done * record_bytes);
      done += in_shard;
      continue;
    }
    std::lock_guard<std::recursive_mutex> lock(h5::lock());
    const fs::path path = impl_->dir / info_.shards[static_cast<size_t>(shard)].file;
    hid_t ds = impl_->images(shard, info_);
    hsize_t start[4] = {static_cast<hsize_t>(local), 0, 0, 0};
    hsize_t counts[4] = {static_cast<hsize_t>(in_shard), static_cast<hsize_t>(info_.height),
                         static_cast<hsize_t>(info_.width), static_cast<hsize_t>(info_.channels)};
    h5::Id fspace(check(H5Dget_space(ds), path, "/images", "no dataspace"), H5Sclose);
    check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, counts, nullptr), path, "/images",
          "select records");
    h5::Id mspace(check(H5Screate_simple(4, counts, nullptr), path, "/images", "create dataspace"), H5Sclose);
    check(H5Dread(ds, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, images + done * record_bytes), path, "/images",
          "truncated or corrupt data, cannot read records");
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
      std::copy_n(run_images.data() + offset * record_bytes, record_bytes,
                  images + at * static_cast<size_t>(record_bytes));
      if (labels) labels[at] = impl_->labels[static_cast<size_t>(indices[at])];
    }
    i = j;
  }
}

void ShardDataset::read_masks(const std::vector<int64_t>& indices, uint8_t* masks) const {
  RT_CHECK(info_.segmentation, "read_masks on split '", info_.split, "', which holds a label per image, no masks");
  const int64_t bytes = info_.mask_bytes();
  for (size_t k = 0; k < indices.size(); ++k) {
    auto [shard, local] = locate(indices[k]);
    uint8_t* out = masks + static_cast<int64_t>(k) * bytes;
    const ShardLayout& sl = impl_->layout[static_cast<size_t>(shard)];
    const fs::path path = impl_->dir / info_.shards[static_cast<size_t>(shard)].file;
    if (impl_->direct_reads && sl.masks.usable) {
      impl_->read_direct_from(sl.masks, "/masks", shard, local, 1, bytes, info_, out);
    } else {
      std::lock_guard<std::recursive_mutex> lock(h5::lock());
      h5::Id file(check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path, "", "cannot open"), H5Fclose);
      h5::Id ds(check(H5Dopen2(file, "masks", H5P_DEFAULT), path, "/masks", "cannot open dataset"), H5Dclose);
      hsize_t start[3] = {static_cast<hsize_t>(local), 0, 0};
      hsize_t counts[3] = {1, static_cast<hsize_t>(info_.height), static_cast<hsize_t>(info_.width)};
      h5::Id fspace(check(H5Dget_space(ds), path, "/masks", "no dataspace"), H5Sclose);
      check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, counts, nullptr), path, "/masks",
            "select record");
      h5::Id mspace(check(H5Screate_simple(3, counts, nullptr), path, "/masks", "create dataspace"), H5Sclose);
      check(H5Dread(ds, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, out), path, "/masks",
            detail::str_cat("truncated or corrupt data, cannot read record ", local));
    }
    for (int64_t i = 0; i < bytes; ++i)
      if (out[i] >= info_.num_classes && out[i] != info_.ignore_index)
        RT_THROW("shard '", path.string(), "', '/masks' record ", local, ": class ", int(out[i]), " at pixel (",
                 i / info_.width, ", ", i % info_.width, ") is outside [0, ", info_.num_classes,
                 ") and not the ignore index ", info_.ignore_index);
  }
}

}  // namespace ringtrain::data
