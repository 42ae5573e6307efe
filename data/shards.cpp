// data/shards.cpp: shard writer, manifest, validation on open, and record reads (one HDF5 lock).
#include "data/shards.h"

#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <list>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "data/codec.h"

namespace ringtrain::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::recursive_mutex& hdf5_mutex() { return detail::hdf5_mutex(); }

std::string shard_file_name(const std::string& split, int index, int count) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "-%05d-of-%05d.h5", index, count);
  return split + buffer;
}

int64_t chunk_records_for(int64_t record_bytes) {
  return std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, record_bytes));
}

uint32_t file_crc32(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) RT_THROW("cannot read '", path.string(), "' to checksum it");
  std::vector<char> buffer(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    std::streamsize got = in.gcount();
    if (got > 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(buffer.data()), static_cast<uInt>(got));
  }
  return static_cast<uint32_t>(crc);
}

namespace {

// True for "{split}-NNNNN-of-NNNNN.h5" (what shard_file_name produces for any index and count).
bool is_shard_file_of(const std::string& name, const std::string& split) {
  const std::string tail = "-00000-of-00000.h5";
  if (name.size() != split.size() + tail.size() || name.compare(0, split.size(), split) != 0) return false;
  for (size_t i = 0; i < tail.size(); ++i) {
    const char c = name[split.size() + i], t = tail[i];
    if (t == '0' ? (c < '0' || c > '9') : c != t) return false;
  }
  return true;
}

std::string hex32(uint32_t v) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "%08x", v);
  return buffer;
}

// RAII for HDF5 ids; closing is no-throw.
struct H5Id {
  hid_t id = H5I_INVALID_HID;
  herr_t (*closer)(hid_t) = nullptr;
  H5Id() = default;
  H5Id(hid_t i, herr_t (*c)(hid_t)) : id(i), closer(c) {}
  H5Id(H5Id&& o) noexcept : id(o.id), closer(o.closer) { o.id = H5I_INVALID_HID; }
  H5Id& operator=(H5Id&& o) noexcept {
    std::swap(id, o.id);
    std::swap(closer, o.closer);
    return *this;
  }
  H5Id(const H5Id&) = delete;
  ~H5Id() {
    if (id >= 0 && closer) closer(id);
  }
  operator hid_t() const { return id; }
};

// Runs an HDF5 step; on failure throws naming the file and object with HDF5's stack translated.
template <typename T>
T h5_or_throw(T result, const fs::path& file, const std::string& object, const std::string& what) {
  if (result < 0) {
    RT_THROW("shard '", file.string(), "'", object.empty() ? "" : ", object '" + object + "'", ": ", what,
             " (HDF5: ", detail::h5_error_text(), ")");
  }
  return result;
}

void write_string_attribute(hid_t loc, const char* name, const std::string& value, const fs::path& file) {
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(1, value.size()));
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists(loc, name) > 0) H5Adelete(loc, name);
  H5Id attr(h5_or_throw(H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT), file, name, "create attribute"),
            H5Aclose);
  h5_or_throw(H5Awrite(attr, type, value.data()), file, name, "write attribute");
}

template <typename T>
void write_array_attribute(hid_t loc, const char* name, hid_t mem_type, hid_t file_type, const std::vector<T>& values,
                           const fs::path& file) {
  hsize_t dims[1] = {values.size()};
  H5Id space(values.size() == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims, nullptr), H5Sclose);
  if (H5Aexists(loc, name) > 0) H5Adelete(loc, name);
  H5Id attr(h5_or_throw(H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT), file, name,
                        "create attribute"),
            H5Aclose);
  h5_or_throw(H5Awrite(attr, mem_type, values.data()), file, name, "write attribute");
}

std::string read_string_attribute(hid_t loc, const char* name, const fs::path& file) {
  if (H5Aexists(loc, name) <= 0) RT_THROW("shard '", file.string(), "': missing root attribute '", name, "'");
  H5Id attr(h5_or_throw(H5Aopen(loc, name, H5P_DEFAULT), file, name, "open attribute"), H5Aclose);
  H5Id type(H5Aget_type(attr), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING) RT_THROW("shard '", file.string(), "': attribute '", name, "' is not a string");
  if (H5Tis_variable_str(type) > 0) {
    char* value = nullptr;
    H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem, H5T_VARIABLE);
    h5_or_throw(H5Aread(attr, mem, &value), file, name, "read attribute");
    std::string s = value ? value : "";
    H5free_memory(value);
    return s;
  }
  size_t size = H5Tget_size(type);
  std::string s(size, '\0');
  h5_or_throw(H5Aread(attr, type, s.data()), file, name, "read attribute");
  s.erase(std::find(s.begin(), s.end(), '\0'), s.end());
  return s;
}

template <typename T>
std::vector<T> read_array_attribute(hid_t loc, const char* name, hid_t mem_type, const fs::path& file) {
  if (H5Aexists(loc, name) <= 0) RT_THROW("shard '", file.string(), "': missing root attribute '", name, "'");
  H5Id attr(h5_or_throw(H5Aopen(loc, name, H5P_DEFAULT), file, name, "open attribute"), H5Aclose);
  H5Id space(H5Aget_space(attr), H5Sclose);
  hssize_t n = H5Sget_simple_extent_npoints(space);
  std::vector<T> values(static_cast<size_t>(std::max<hssize_t>(n, 0)));
  h5_or_throw(H5Aread(attr, mem_type, values.data()), file, name, "read attribute");
  return values;
}

json split_to_json(const SplitInfo& s) {
  json shards = json::array();
  for (const auto& sh : s.shards) shards.push_back({{"file", sh.file}, {"records", sh.records}, {"crc32", hex32(sh.crc32)}});
  return {{"records", s.records},
          {"image_shape", {s.height, s.width, s.channels}},
          {"encoded", s.encoded},
          {"num_classes", s.num_classes},
          {"classes", s.classes},
          {"mean", s.mean},
          {"std", s.std},
          {"source", s.source},
          {"shards", shards}};
}

SplitInfo split_from_json(const std::string& name, const json& j, const fs::path& manifest) {
  try {
    SplitInfo s;
    s.split = name;
    s.records = j.at("records").get<int64_t>();
    auto shape = j.at("image_shape").get<std::vector<int64_t>>();
    if (shape.size() != 3) RT_THROW("image_shape must have 3 entries (H, W, C)");
    s.height = shape[0];
    s.width = shape[1];
    s.channels = shape[2];
    s.encoded = j.value("encoded", false);
    s.num_classes = j.at("num_classes").get<int>();
    s.classes = j.value("classes", std::vector<std::string>{});
    s.mean = j.value("mean", std::vector<float>{});
    s.std = j.value("std", std::vector<float>{});
    s.source = j.value("source", std::string());
    for (const auto& sh : j.at("shards")) {
      ShardInfo info;
      info.file = sh.at("file").get<std::string>();
      info.records = sh.at("records").get<int64_t>();
      info.crc32 = static_cast<uint32_t>(std::stoul(sh.at("crc32").get<std::string>(), nullptr, 16));
      s.shards.push_back(info);
    }
    return s;
  } catch (const Error& e) {
    RT_THROW("manifest '", manifest.string(), "', split '", name, "': ", e.what());
  } catch (const std::exception& e) {
    RT_THROW("manifest '", manifest.string(), "', split '", name, "' is malformed: ", e.what());
  }
}

json load_manifest_json(const fs::path& dir) {
  const fs::path path = dir / "manifest.json";
  if (!fs::exists(dir)) RT_THROW("dataset folder '", dir.string(), "' does not exist");
  if (!fs::exists(path))
    RT_THROW("dataset folder '", dir.string(), "' has no manifest.json (write one with make_shards)");
  std::ifstream in(path);
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    RT_THROW("manifest '", path.string(), "' is not valid JSON: ", e.what());
  }
  if (j.value("format", std::string()) != kFormatName)
    RT_THROW("manifest '", path.string(), "' has format '", j.value("format", std::string("?")), "', expected '",
             kFormatName, "'");
  if (j.value("format_version", 0) != kFormatVersion)
    RT_THROW("manifest '", path.string(), "' has format_version ", j.value("format_version", 0),
             "; this ringtrain reads version ", kFormatVersion);
  return j;
}

}  // namespace

std::vector<SplitInfo> read_manifest(const fs::path& dir) {
  json j = load_manifest_json(dir);
  std::vector<SplitInfo> splits;
  for (auto& [name, value] : j.at("splits").items()) splits.push_back(split_from_json(name, value, dir / "manifest.json"));
  return splits;
}

// ---------------------------------------------------------------------------------------------------
// Writer

struct ShardWriter::Impl {
  WriterOptions options;
  int64_t record_bytes = 0, chunk = 0;
  std::vector<int64_t> shard_begin;  // global index where each shard starts (size num_shards + 1)
  int current = -1;                  // open shard
  H5Id file, images, labels_ds, shapes_ds;
  std::vector<uint8_t> pending;      // records not yet written to the current shard (<= chunk)
  int64_t pending_first = 0;         // local index of pending's first record
  std::vector<int32_t> labels;       // current shard's labels
  std::vector<int32_t> shapes;       // current shard's decoded shapes (encoded splits)
  std::vector<double> sums, squares; // per channel, over all records
  std::vector<ShardInfo> shards;
  std::vector<fs::path> temp_files;
  bool finished = false;

  fs::path temp_path(int i) const {
    return options.dir / (shard_file_name(options.split, i, options.num_shards) + ".partial");
  }

  void open_shard(int i) {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    detail::h5_silence_errors();
    const fs::path path = temp_path(i);
    const int64_t n = shard_begin[static_cast<size_t>(i) + 1] - shard_begin[static_cast<size_t>(i)];
    file = H5Id(h5_or_throw(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), path, "", "create file"),
                H5Fclose);
    temp_files.push_back(path);
    if (!options.encoded) {
      hsize_t dims[4] = {static_cast<hsize_t>(n), static_cast<hsize_t>(options.height),
                         static_cast<hsize_t>(options.width), static_cast<hsize_t>(options.channels)};
      H5Id space(H5Screate_simple(4, dims, nullptr), H5Sclose);
      H5Id plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      if (n > 0) {
        hsize_t chunk_dims[4] = {static_cast<hsize_t>(std::min(chunk, n)), dims[1], dims[2], dims[3]};
        H5Pset_chunk(plist, 4, chunk_dims);
      }
      images = H5Id(h5_or_throw(H5Dcreate2(file, "images", H5T_STD_U8LE, space, H5P_DEFAULT, plist, H5P_DEFAULT), path,
                                "/images", "create dataset"),
                    H5Dclose);
    } else {
      hsize_t dims[1] = {static_cast<hsize_t>(n)};
      H5Id space(H5Screate_simple(1, dims, nullptr), H5Sclose);
      H5Id vlen(H5Tvlen_create(H5T_STD_U8LE), H5Tclose);
      images = H5Id(h5_or_throw(H5Dcreate2(file, "jpeg", vlen, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path,
                                "/jpeg", "create dataset"),
                    H5Dclose);
    }
    current = i;
    pending.clear();
    pending_first = 0;
    labels.clear();
    shapes.clear();
  }

  void flush_pending() {
    if (pending.empty() || options.encoded) return;
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    const int64_t count = static_cast<int64_t>(pending.size()) / record_bytes;
    hsize_t start[4] = {static_cast<hsize_t>(pending_first), 0, 0, 0};
    hsize_t counts[4] = {static_cast<hsize_t>(count), static_cast<hsize_t>(options.height),
                         static_cast<hsize_t>(options.width), static_cast<hsize_t>(options.channels)};
    H5Id fspace(H5Dget_space(images), H5Sclose);
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, counts, nullptr);
    H5Id mspace(H5Screate_simple(4, counts, nullptr), H5Sclose);
    h5_or_throw(H5Dwrite(images, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, pending.data()), temp_path(current),
                "/images", "write records");
    pending_first += count;
    pending.clear();
  }

  void close_shard() {
    if (current < 0) return;
    flush_pending();
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    const fs::path path = temp_path(current);
    hsize_t dims[1] = {labels.size()};
    H5Id space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    H5Id ds(h5_or_throw(H5Dcreate2(file, "labels", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path,
                        "/labels", "create dataset"),
            H5Dclose);
    if (!labels.empty())
      h5_or_throw(H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()), path, "/labels",
                  "write labels");
    if (options.encoded) {
      hsize_t sdims[2] = {labels.size(), 3};
      H5Id sspace(H5Screate_simple(2, sdims, nullptr), H5Sclose);
      H5Id sds(h5_or_throw(H5Dcreate2(file, "shapes", H5T_STD_I32LE, sspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                           path, "/shapes", "create dataset"),
               H5Dclose);
      if (!shapes.empty())
        h5_or_throw(H5Dwrite(sds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, shapes.data()), path, "/shapes",
                    "write shapes");
    }
    ShardInfo info;
    info.file = shard_file_name(options.split, current, options.num_shards);
    info.records = static_cast<int64_t>(labels.size());
    shards.push_back(info);
    images = H5Id();
    file = H5Id();
    current = -1;
  }

  void start_record(int64_t global) {
    if (current < 0 || global >= shard_begin[static_cast<size_t>(current) + 1]) {
      close_shard();
      int next = static_cast<int>(std::upper_bound(shard_begin.begin(), shard_begin.end(), global) -
                                  shard_begin.begin()) - 1;
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
  RT_CHECK(!o.split.empty() && o.split.find('/') == std::string::npos && o.split.find('-') == std::string::npos,
           "ShardWriter: split name '", o.split, "' must be non-empty without '/' or '-'");
  RT_CHECK(o.num_shards >= 1, "ShardWriter: --shards must be >= 1, got ", o.num_shards);
  RT_CHECK(o.total_records >= 0, "ShardWriter: negative record count ", o.total_records);
  RT_CHECK(o.height > 0 && o.width > 0 && o.channels > 0, "ShardWriter: bad image shape ", o.height, "x", o.width,
           "x", o.channels);
  RT_CHECK(o.num_classes >= 1, "ShardWriter: num_classes must be >= 1, got ", o.num_classes);
  RT_CHECK(o.classes.empty() || static_cast<int>(o.classes.size()) == o.num_classes, "ShardWriter: ",
           o.classes.size(), " class names for ", o.num_classes, " classes");
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
      std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
      impl_->images = H5Id();
      impl_->file = H5Id();
    } catch (...) {
    }
    impl_->remove_partials();
  }
  delete impl_;
}

void ShardWriter::add(const uint8_t* image, int32_t label) {
  auto& m = *impl_;
  RT_CHECK(!m.options.encoded, "ShardWriter::add on an encoded split (use add_encoded)");
  if (written_ >= m.options.total_records)
    RT_THROW("ShardWriter: more than the announced ", m.options.total_records, " records for split '", m.options.split,
             "'");
  if (label < 0 || label >= m.options.num_classes)
    RT_THROW("ShardWriter: record ", written_, " of split '", m.options.split, "' has label ", label, " outside [0, ",
             m.options.num_classes, ")");
  m.start_record(written_);
  m.pending.insert(m.pending.end(), image, image + m.record_bytes);
  m.labels.push_back(label);
  const int64_t c = m.options.channels;
  for (int64_t i = 0; i < m.record_bytes; ++i) {
    const double v = image[i] / 255.0;
    m.sums[static_cast<size_t>(i % c)] += v;
    m.squares[static_cast<size_t>(i % c)] += v * v;
  }
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
  if (decoded_hwc[0] != m.options.height || decoded_hwc[1] != m.options.width || decoded_hwc[2] != m.options.channels)
    RT_THROW("ShardWriter: record ", written_, " decodes to ", decoded_hwc[0], "x", decoded_hwc[1], "x", decoded_hwc[2],
             ", the split's images are ", m.options.height, "x", m.options.width, "x", m.options.channels);
  RT_CHECK(static_cast<int64_t>(channel_sums.size()) == m.options.channels &&
               static_cast<int64_t>(channel_squares.size()) == m.options.channels,
           "ShardWriter::add_encoded: channel sums must have one entry per channel");
  m.start_record(written_);
  {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    const int64_t local = static_cast<int64_t>(m.labels.size());
    hvl_t value{bytes.size(), const_cast<uint8_t*>(bytes.data())};
    hsize_t start[1] = {static_cast<hsize_t>(local)}, count[1] = {1};
    H5Id fspace(H5Dget_space(m.images), H5Sclose);
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
    H5Id mspace(H5Screate_simple(1, count, nullptr), H5Sclose);
    H5Id vlen(H5Tvlen_create(H5T_NATIVE_UINT8), H5Tclose);
    h5_or_throw(H5Dwrite(m.images, vlen, mspace, fspace, H5P_DEFAULT, &value), m.temp_path(m.current), "/jpeg",
                "write record");
  }
  m.labels.push_back(label);
  for (int k = 0; k < 3; ++k) m.shapes.push_back(static_cast<int32_t>(decoded_hwc[k]));
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
  const double pixels = static_cast<double>(std::max<int64_t>(1, o.total_records)) * o.height * o.width;
  for (int64_t c = 0; c < o.channels; ++c) {
    const double mean = m.sums[static_cast<size_t>(c)] / pixels;
    const double var = std::max(0.0, m.squares[static_cast<size_t>(c)] / pixels - mean * mean);
    info.mean.push_back(static_cast<float>(mean));
    info.std.push_back(static_cast<float>(std::sqrt(var)));
  }
  // Attributes, then checksum, then rename: a crash never leaves a final-named partial shard.
  for (int s = 0; s < o.num_shards; ++s) {
    const fs::path tmp = m.temp_path(s);
    {
      std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
      H5Id file(h5_or_throw(H5Fopen(tmp.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), tmp, "", "reopen"), H5Fclose);
      write_string_attribute(file, "format", kFormatName, tmp);
      write_array_attribute<int32_t>(file, "format_version", H5T_NATIVE_INT32, H5T_STD_I32LE, {kFormatVersion}, tmp);
      write_string_attribute(file, "split", o.split, tmp);
      write_array_attribute<int32_t>(file, "num_classes", H5T_NATIVE_INT32, H5T_STD_I32LE, {o.num_classes}, tmp);
      write_array_attribute<float>(file, "mean", H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, info.mean, tmp);
      write_array_attribute<float>(file, "std", H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, info.std, tmp);
      write_string_attribute(file, "source", o.source, tmp);
      write_array_attribute<int32_t>(file, "shard_index", H5T_NATIVE_INT32, H5T_STD_I32LE, {s}, tmp);
      write_array_attribute<int32_t>(file, "num_shards", H5T_NATIVE_INT32, H5T_STD_I32LE, {o.num_shards}, tmp);
      h5_or_throw(H5Fflush(file, H5F_SCOPE_GLOBAL), tmp, "", "flush");
    }
    m.shards[static_cast<size_t>(s)].crc32 = file_crc32(tmp);
  }
  // Stale shards of this split from an earlier run with another shard count would confuse readers.
  for (const auto& entry : fs::directory_iterator(o.dir)) {
    if (is_shard_file_of(entry.path().filename().string(), o.split)) fs::remove(entry.path());
  }
  for (int s = 0; s < o.num_shards; ++s) fs::rename(m.temp_path(s), o.dir / m.shards[static_cast<size_t>(s)].file);
  m.temp_files.clear();
  info.shards = m.shards;

  json manifest;
  if (fs::exists(o.dir / "manifest.json")) {
    try {
      manifest = load_manifest_json(o.dir);
    } catch (const Error&) {
      manifest = json();  // unreadable or other format: replaced
    }
  }
  if (!manifest.is_object()) manifest = json::object();
  manifest["format"] = kFormatName;
  manifest["format_version"] = kFormatVersion;
  manifest["source"] = o.source;
  manifest["splits"][o.split] = split_to_json(info);
  const fs::path tmp_manifest = o.dir / "manifest.json.partial";
  {
    std::ofstream out(tmp_manifest);
    out << manifest.dump(2) << "\n";
    if (!out) RT_THROW("cannot write '", tmp_manifest.string(), "'");
  }
  fs::rename(tmp_manifest, o.dir / "manifest.json");
  m.finished = true;
  ShardDataset::open(o.dir, o.split);  // validates what we wrote
  return info;
}

// ---------------------------------------------------------------------------------------------------
// Reader

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
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    for (auto& o : open) close(o);
  }

  static void close(Open& o) {
    if (o.images >= 0) H5Dclose(o.images);
    if (o.file >= 0) H5Fclose(o.file);
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
    H5Id file(h5_or_throw(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path, "", "cannot open"), H5Fclose);
    const hid_t images = H5Dopen2(file, name, H5P_DEFAULT);
    if (images < 0) {
      lru.remove(shard);
      h5_or_throw(images, path, name, "cannot open dataset");
    }
    o.file = file.id;
    file.id = H5I_INVALID_HID;
    o.images = images;
    return o.images;
  }
};

namespace {

// Validates one shard file against the manifest entry; returns nothing, throws naming file and object.
// Appends the shard's labels to `all_labels`.
void validate_shard(const fs::path& path, const SplitInfo& info, const ShardInfo& shard, bool check_labels,
                    std::vector<int32_t>& all_labels) {
  detail::h5_silence_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0)
    RT_THROW("shard '", path.string(), "' is truncated or not an HDF5 file (HDF5: ", detail::h5_error_text(), ")");
  H5Id file(h5_or_throw(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path, "",
                        "truncated or corrupt file, cannot open"),
            H5Fclose);
  const std::string format = read_string_attribute(file, "format", path);
  if (format != kFormatName) RT_THROW("shard '", path.string(), "': attribute 'format' is '", format, "', expected '", kFormatName, "'");
  const auto version = read_array_attribute<int32_t>(file, "format_version", H5T_NATIVE_INT32, path);
  if (version.size() != 1 || version[0] != kFormatVersion)
    RT_THROW("shard '", path.string(), "': format_version ", version.empty() ? -1 : version[0], ", expected ", kFormatVersion);
  const auto classes = read_array_attribute<int32_t>(file, "num_classes", H5T_NATIVE_INT32, path);
  if (classes.size() != 1 || classes[0] != info.num_classes)
    RT_THROW("shard '", path.string(), "': num_classes ", classes.empty() ? -1 : classes[0],
             " disagrees with the manifest's ", info.num_classes);

  const char* image_name = info.encoded ? "jpeg" : "images";
  if (H5Lexists(file, image_name, H5P_DEFAULT) <= 0)
    RT_THROW("shard '", path.string(), "': missing dataset '/", image_name, "'");
  if (H5Lexists(file, "labels", H5P_DEFAULT) <= 0) RT_THROW("shard '", path.string(), "': missing dataset '/labels'");
  const std::string image_object = std::string("/") + image_name;
  H5Id images(h5_or_throw(H5Dopen2(file, image_name, H5P_DEFAULT), path, image_object, "cannot open dataset"), H5Dclose);
  H5Id itype(H5Dget_type(images), H5Tclose);
  H5Id ispace(H5Dget_space(images), H5Sclose);
  const int irank = H5Sget_simple_extent_ndims(ispace);
  hsize_t idims[4] = {0, 0, 0, 0};
  if (!info.encoded) {
    if (H5Tget_class(itype) != H5T_INTEGER || H5Tget_size(itype) != 1 || H5Tget_sign(itype) != H5T_SGN_NONE)
      RT_THROW("shard '", path.string(), "': dataset '/images' must be uint8");
    if (irank != 4) RT_THROW("shard '", path.string(), "': dataset '/images' has rank ", irank, ", expected 4 (N x H x W x C)");
    H5Sget_simple_extent_dims(ispace, idims, nullptr);
    if (static_cast<int64_t>(idims[1]) != info.height || static_cast<int64_t>(idims[2]) != info.width ||
        static_cast<int64_t>(idims[3]) != info.channels)
      RT_THROW("shard '", path.string(), "': dataset '/images' holds ", idims[1], "x", idims[2], "x", idims[3],
               " images but the split's images are ", info.height, "x", info.width, "x", info.channels);
  } else {
    if (H5Tget_class(itype) != H5T_VLEN) RT_THROW("shard '", path.string(), "': dataset '/jpeg' must be variable-length uint8");
    if (irank != 1) RT_THROW("shard '", path.string(), "': dataset '/jpeg' has rank ", irank, ", expected 1");
    H5Sget_simple_extent_dims(ispace, idims, nullptr);
  }
  if (static_cast<int64_t>(idims[0]) != shard.records)
    RT_THROW("shard '", path.string(), "': dataset '", image_object, "' has ", idims[0], " records, the manifest says ",
             shard.records);

  H5Id labels(h5_or_throw(H5Dopen2(file, "labels", H5P_DEFAULT), path, "/labels", "cannot open dataset"), H5Dclose);
  H5Id ltype(H5Dget_type(labels), H5Tclose);
  H5Id lspace(H5Dget_space(labels), H5Sclose);
  if (H5Tget_class(ltype) != H5T_INTEGER || H5Tget_size(ltype) != 4 || H5Tget_sign(ltype) != H5T_SGN_2)
    RT_THROW("shard '", path.string(), "': dataset '/labels' must be int32");
  const int lrank = H5Sget_simple_extent_ndims(lspace);
  if (lrank != 1) RT_THROW("shard '", path.string(), "': dataset '/labels' has rank ", lrank, ", expected 1");
  hsize_t ldims[1] = {0};
  H5Sget_simple_extent_dims(lspace, ldims, nullptr);
  if (ldims[0] != idims[0])
    RT_THROW("shard '", path.string(), "': ", idims[0], " images but ", ldims[0], " labels in dataset '/labels'");
  std::vector<int32_t> values(ldims[0]);
  if (ldims[0] > 0)
    h5_or_throw(H5Dread(labels, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), path, "/labels",
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
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  detail::h5_silence_errors();
  json manifest = load_manifest_json(dir);
  const fs::path manifest_path = dir / "manifest.json";
  if (!manifest.contains("splits") || !manifest["splits"].contains(split)) {
    std::string available;
    if (manifest.contains("splits"))
      for (auto& [name, v] : manifest["splits"].items()) available += (available.empty() ? "" : ", ") + name;
    RT_THROW("manifest '", manifest_path.string(), "' has no split '", split, "' (it has: ",
             available.empty() ? "none" : available, ")");
  }
  ShardDataset ds;
  ds.info_ = split_from_json(split, manifest["splits"][split], manifest_path);
  const SplitInfo& info = ds.info_;
  int64_t total = 0;
  std::set<std::string> listed;
  std::vector<int32_t> labels;
  for (const auto& shard : info.shards) {
    listed.insert(shard.file);
    const fs::path path = dir / shard.file;
    if (!fs::exists(path)) RT_THROW("shard '", path.string(), "' listed in '", manifest_path.string(), "' is missing");
    if (options.verify_checksums) {
      const uint32_t crc = file_crc32(path);
      if (crc != shard.crc32)
        RT_THROW("shard '", path.string(), "' is corrupt: CRC-32 ", hex32(crc), " but the manifest says ",
                 hex32(shard.crc32));
    }
    validate_shard(path, info, shard, options.check_labels, labels);
    total += shard.records;
  }
  if (total != info.records)
    RT_THROW("manifest '", manifest_path.string(), "': split '", split, "' says ", info.records,
             " records but its shards hold ", total);
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (is_shard_file_of(name, split) && !listed.count(name))
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
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  const fs::path path = impl_->dir / info_.shards[static_cast<size_t>(shard)].file;
  hid_t ds = impl_->images(shard, info_);
  hsize_t start[1] = {static_cast<hsize_t>(local)}, count[1] = {1};
  H5Id fspace(H5Dget_space(ds), H5Sclose);
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
  H5Id mspace(H5Screate_simple(1, count, nullptr), H5Sclose);
  H5Id vlen(H5Tvlen_create(H5T_NATIVE_UINT8), H5Tclose);
  hvl_t value{0, nullptr};
  h5_or_throw(H5Dread(ds, vlen, mspace, fspace, H5P_DEFAULT, &value), path, "/jpeg", "truncated or corrupt record");
  std::vector<uint8_t> bytes(static_cast<const uint8_t*>(value.p), static_cast<const uint8_t*>(value.p) + value.len);
  H5Dvlen_reclaim(vlen, mspace, H5P_DEFAULT, &value);
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
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  int64_t done = 0;
  while (done < count) {
    auto [shard, local] = locate(begin + done);
    const int64_t in_shard = std::min(count - done, info_.shards[static_cast<size_t>(shard)].records - local);
    const fs::path path = impl_->dir / info_.shards[static_cast<size_t>(shard)].file;
    hid_t ds = impl_->images(shard, info_);
    hsize_t start[4] = {static_cast<hsize_t>(local), 0, 0, 0};
    hsize_t counts[4] = {static_cast<hsize_t>(in_shard), static_cast<hsize_t>(info_.height),
                         static_cast<hsize_t>(info_.width), static_cast<hsize_t>(info_.channels)};
    H5Id fspace(H5Dget_space(ds), H5Sclose);
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, counts, nullptr);
    H5Id mspace(H5Screate_simple(4, counts, nullptr), H5Sclose);
    h5_or_throw(H5Dread(ds, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, images + done * record_bytes), path,
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
