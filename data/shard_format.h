// data/shard_format.h (internal to data/): what the manifest, the shard writer and the shard dataset share —
// shard file names, the manifest's JSON form, and where HDF5 errors happened ("shard 'f.h5', object
// '/labels'"). docs/DATA_FORMAT.md is the format itself.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/shards.h"
#include "io/hdf5.h"

namespace ringtrain::data::format {

// True for "{split}-NNNNN-of-NNNNN.h5" (what shard_file_name produces for any index and count).
bool is_shard_file_of(const std::string& name, const std::string& split);
std::string hex32(uint32_t v);
inline h5::Where shard_at(const std::filesystem::path& file, std::string object = {}) {
  return h5::Where{"shard", file, std::move(object)};
}
// h5::check with the shard's file and object ("" for the file itself).
template <typename T>
T check(T result, const std::filesystem::path& file, const std::string& object, const std::string& what) {
  return h5::check(result, shard_at(file, object), what);
}

// The largest side of a record in a split of varied sizes (its /shapes rows), for the writer and the reader.
inline constexpr int64_t kMaxVariedSide = 65535;

// Adds each byte of an HWC image (as pixel / 255) to its channel's sum and sum of squares: the statistics
// the writer turns into the split's mean/std (converters that store JPEGs compute them from the pixels).
inline void add_channel_sums(const uint8_t* pixels, int64_t bytes, int64_t channels, std::vector<double>& sums,
                             std::vector<double>& squares) {
  for (int64_t i = 0; i < bytes; ++i) {
    const double v = pixels[i] / 255.0;
    sums[static_cast<size_t>(i % channels)] += v;
    squares[static_cast<size_t>(i % channels)] += v * v;
  }
}

// manifest.json: read and checked (format, version); a split to and from its JSON entry; errors name the
// manifest file and the split.
nlohmann::json load_manifest_json(const std::filesystem::path& dir);
nlohmann::json split_to_json(const SplitInfo& s);
SplitInfo split_from_json(const std::string& name, const nlohmann::json& j, const std::filesystem::path& manifest);
// Writes `split` into the folder's manifest (other splits kept; an unreadable manifest is replaced), atomically.
void write_manifest_split(const std::filesystem::path& dir, const std::string& source, const SplitInfo& split);

}  // namespace ringtrain::data::format
