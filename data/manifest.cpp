// data/manifest.cpp: shard file names, checksums and manifest.json (read, checked, updated atomically).
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "core/check.h"
#include "data/shard_format.h"

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
  manifest["format_version"] = kFormatVersion;
  manifest["source"] = source;
  manifest["splits"][split.split] = split_to_json(split);
  const fs::path tmp_manifest = dir / "manifest.json.partial";
  {
    std::ofstream out(tmp_manifest);
    out << manifest.dump(2) << "\n";
    if (!out) RT_THROW("cannot write '", tmp_manifest.string(), "'");
  }
  fs::rename(tmp_manifest, dir / "manifest.json");
}

}  // namespace format

std::vector<SplitInfo> read_manifest(const fs::path& dir) {
  json j = format::load_manifest_json(dir);
  std::vector<SplitInfo> splits;
  for (auto& [name, value] : j.at("splits").items()) splits.push_back(format::split_from_json(name, value, dir / "manifest.json"));
  return splits;
}


}  // namespace ringtrain::data
