// data/manifest.cpp: shard file names, checksums and manifest.json (read, checked, updated atomically).
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <set>

#include "core/check.h"
#include "data/shard_format.h"
#include "io/files.h"
#include "io/json_in.h"

namespace ringtrain::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::recursive_mutex& hdf5_mutex() { return h5::lock(); }

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
  if (in.bad()) RT_THROW("reading '", path.string(), "' to checksum it failed");
  return static_cast<uint32_t>(crc);
}

namespace format {

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

}  // namespace format

std::string SplitInfo::shape_text() const {
  return varied_size() ? detail::str_cat("varied x ", channels) : detail::str_cat(height, "x", width, "x", channels);
}

namespace format {

json split_to_json(const SplitInfo& s) {
  json shards = json::array();
  for (const auto& sh : s.shards)
    shards.push_back({{"file", sh.file}, {"records", sh.records}, {"crc32", hex32(sh.crc32)}});
  json j = {{"records", s.records}, {"image_shape", {s.height, s.width, s.channels}},
            {"encoded", s.encoded}, {"num_classes", s.num_classes},
            {"classes", s.classes}, {"mean", s.mean},
            {"std", s.std},         {"source", s.source},
            {"shards", shards}};
  if (s.segmentation) {
    j["task"] = "segmentation";
    j["ignore_index"] = s.ignore_index;
  }
  return j;
}

namespace {

constexpr int64_t kMaxRecords = int64_t{1} << 40;

// An entry of image_shape, checked.
int64_t shape_entry(const io::JsonIn& e, size_t i, int64_t min, int64_t max) {
  const json& v = e.raw()["image_shape"][i];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max)) ||
      v.get<int64_t>() < min || v.get<int64_t>() > max)
    RT_THROW(e.name(detail::str_cat("image_shape[", i, "]")), " must be a whole number from ", min, " to ", max,
             ", got ", v.dump());
  return v.get<int64_t>();
}

}  // namespace

SplitInfo split_from_json(const std::string& name, const json& j, const fs::path& manifest) {
  try {
    // The writer's rule for split names: they are part of every shard's file name, so nothing that could
    // lead out of the folder ('/', "..") or confuse the "-NNNNN-of-NNNNN" tail ('-').
    if (name.empty() || name.find_first_of("/\\-") != std::string::npos || name.find("..") != std::string::npos)
      RT_THROW("the split name must be non-empty, without '/', '\\', '-' or '..'");
    const io::JsonIn e(j, manifest.string(), "splits." + name);
    SplitInfo s;
    s.split = name;
    s.records = e.integer("records", 0, kMaxRecords);
    const json& shape = j.contains("image_shape") ? j["image_shape"] : json();
    if (!shape.is_array() || shape.size() != 3) e.wrong("image_shape", "[H, W, C]");
    s.encoded = e.boolean_or("encoded", false);
    // [0, 0, C]: encoded images of varied sizes.
    const bool varied = s.encoded && shape[0] == 0 && shape[1] == 0;
    s.height = varied ? 0 : shape_entry(e, 0, 1, 1 << 16);
    s.width = varied ? 0 : shape_entry(e, 1, 1, 1 << 16);
    s.channels = shape_entry(e, 2, 1, 4096);
    if (s.record_bytes() > (int64_t{1} << 30))
      RT_THROW(e.name("image_shape"), " ", shape.dump(), " is over 1 GiB per image");
    s.num_classes = static_cast<int>(e.integer("num_classes", 1, 1 << 24));
    s.classes = e.texts_or("classes");
    if (!s.classes.empty() && static_cast<int>(s.classes.size()) != s.num_classes)
      RT_THROW(e.name("classes"), " has ", s.classes.size(), " names for num_classes ", s.num_classes);
    s.mean = e.floats_or("mean");
    s.std = e.floats_or("std");
    // One entry per channel, each: a missing or empty list trained unnormalised without a word (make_shards
    // has always written both).
    for (const auto* v : {&s.mean, &s.std})
      if (static_cast<int64_t>(v->size()) != s.channels)
        RT_THROW(e.name(v == &s.mean ? "mean" : "std"), v->empty() ? " is missing or empty" : " has ",
                 v->empty() ? std::string() : std::to_string(v->size()) + " entries", " for ", s.channels,
                 " channels: the images are normalised per channel by mean and std (rewrite the dataset with "
                 "make_shards, or give one value per channel)");
    // Inputs are divided by std: 0 or below would not normalise as the data says (it was once replaced by 1).
    for (size_t c = 0; c < s.std.size(); ++c)
      if (!(s.std[c] > 0))
        RT_THROW(e.name(detail::str_cat("std[", c, "]")), " is ", s.std[c],
                 ": a standard deviation must be above 0 (rewrite the ", "dataset with make_shards, or fix the value)");
    s.source = e.text_or("source", "");
    const std::string task = e.text_or("task", "classification");
    if (task != "classification" && task != "segmentation")
      RT_THROW(e.name("task"), " is '", task, "', expected classification or segmentation");
    s.segmentation = task == "segmentation";
    if (s.segmentation) {
      if (s.encoded) RT_THROW(e.name("task"), " is segmentation, whose images are stored decoded (encoded is true)");
      if (s.num_classes > 255)
        RT_THROW(e.name("num_classes"), " is ", s.num_classes, ": a segmentation mask holds classes below 255");
      s.ignore_index = static_cast<int>(e.integer_or("ignore_index", 255, 255, 255));
    }
    const std::vector<io::JsonIn> shards = e.objects("shards");
    if (shards.empty()) e.wrong("shards", "a non-empty list");
    std::set<std::string> seen;
    for (size_t i = 0; i < shards.size(); ++i) {
      const io::JsonIn& sh = shards[i];
      ShardInfo info;
      info.file = sh.text("file");
      // A plain file name of this split: never a path out of the dataset folder (or into another split).
      if (!is_shard_file_of(info.file, name))
        RT_THROW(sh.name("file"), " is '", info.file, "', not a shard file of split '", name,
                 "' in the dataset folder (",
                 shard_file_name(name, static_cast<int>(i), static_cast<int>(shards.size())), " and the like)");
      if (!seen.insert(info.file).second) RT_THROW("shard '", info.file, "' is listed twice (shards[", i, "])");
      info.records = sh.integer("records", 0, kMaxRecords);
      const std::string crc = sh.text("crc32");
      if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        sh.wrong("crc32", "8 hex digits");
      std::from_chars(crc.data(), crc.data() + crc.size(), info.crc32, 16);  // 8 hex digits, checked above
      s.shards.push_back(info);
    }
    return s;
  } catch (const Error& e) {
    const std::string text = e.what();
    if (text.find(manifest.string()) != std::string::npos) throw;  // JsonIn named the file and key
    RT_THROW("manifest '", manifest.string(), "', split '", name, "': ", text);
  } catch (const std::exception& e) {
    RT_THROW("manifest '", manifest.string(), "', split '", name, "' is malformed: ", e.what());
  }
}

json load_manifest_json(const fs::path& dir) {
  const fs::path path = dir / "manifest.json";
  if (!fs::exists(dir)) RT_THROW("dataset folder '", dir.string(), "' does not exist");
  if (!fs::exists(path))
    RT_THROW("dataset folder '", dir.string(), "' has no manifest.json (write one with make_shards)");
  json j = io::parse_json_file(path, "manifest");
  const io::JsonIn in(j, path.string());
  const std::string format = in.text_or("format", "?");
  if (format != kFormatName)
    RT_THROW("manifest '", path.string(), "' has format '", format, "', expected '", kFormatName, "'");
  const int64_t version = in.integer_or("format_version", 0, 0, 1 << 30);
  if (version < kOldestReadableFormatVersion || version > kFormatVersion)
    RT_THROW("manifest '", path.string(), "' has format_version ", version, "; this ringtrain reads versions ",
             kOldestReadableFormatVersion, " to ", kFormatVersion,
             version > kFormatVersion
                 ? " (written by a newer ringtrain: update, or rewrite the dataset with make_shards)"
                 : "");
  in.at("splits");  // an object, or an error naming the file and the key
  return j;
}

void write_manifest_split(const fs::path& dir, const std::string& source, const SplitInfo& split) {
  json manifest;
  if (fs::exists(dir / "manifest.json")) {
    try {
      manifest = load_manifest_json(dir);
    } catch (const Error&) {
      manifest = json();  // unreadable or other format: replaced
    }
  }
  if (!manifest.is_object()) manifest = json::object();
  manifest["format"] = kFormatName;
  manifest["source"] = source;
  manifest["splits"][split.split] = split_to_json(split);
  // The oldest version that can read every split in it: 4 only if one is a segmentation split, 3 if one has
  // images of varied sizes.
  int version = 2;
  for (auto& [name, entry] : manifest["splits"].items()) {
    const json& shape = entry.value("image_shape", json::array());
    if (shape.is_array() && !shape.empty() && shape[0] == 0) version = std::max(version, 3);
    if (entry.value("task", std::string()) == "segmentation") version = 4;
  }
  manifest["format_version"] = version;
  const fs::path tmp_manifest = dir / "manifest.json.partial";
  // Closed and checked before the rename: a short file (a full disk) never becomes the manifest.
  try {
    io::write_text(tmp_manifest, manifest.dump(2) + "\n", "the manifest");
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp_manifest, ec);
    throw;
  }
  fs::rename(tmp_manifest, dir / "manifest.json");
}

}  // namespace format

std::vector<SplitInfo> read_manifest(const fs::path& dir) {
  json j = format::load_manifest_json(dir);
  std::vector<SplitInfo> splits;
  for (auto& [name, value] : j.at("splits").items())
    splits.push_back(format::split_from_json(name, value, dir / "manifest.json"));
  return splits;
}

}  // namespace ringtrain::data
