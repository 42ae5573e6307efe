// data/idx.cpp: idx file readers (see idx.h). zlib's gz* functions read both gzipped and plain files.
#include "data/idx.h"

#include <zlib.h>

#include <cstdio>
#include <string>

#include "core/check.h"

namespace ringtrain::data {
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // uint8 data, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // uint8 data, 1 dimension

fs::path resolve(const fs::path& path) {
  if (fs::exists(path)) return path;
  fs::path gz = path;
  gz += ".gz";
  if (fs::exists(gz)) return gz;
  RT_THROW("idx file '", path.string(), "' not found (nor '", gz.string(), "')");
}

std::vector<uint8_t> read_all(const fs::path& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) RT_THROW("cannot open idx file '", path.string(), "'");
  // The default 8 KiB buffer makes a 26 MiB gunzip noticeably slower.
  gzbuffer(file, 1 << 18);
  std::vector<uint8_t> bytes;
  constexpr size_t kStep = 1 << 20;
  int n = 0;
  do {
    const size_t old_size = bytes.size();
    bytes.resize(old_size + kStep);
    n = gzread(file, bytes.data() + old_size, static_cast<unsigned>(kStep));
    bytes.resize(old_size + static_cast<size_t>(n > 0 ? n : 0));
  } while (n > 0);
  std::string message;
  if (n < 0) {
    int code = 0;
    message = gzerror(file, &code);
  }
  // gzclose reports a gzip stream that ended early (Z_BUF_ERROR) even when every gzread succeeded.
  const int close_status = gzclose(file);
  if (n < 0) RT_THROW("idx file '", path.string(), "' is corrupt: ", message);
  if (close_status == Z_BUF_ERROR) RT_THROW("idx file '", path.string(), "' is corrupt: gzip stream is truncated");
  if (close_status != Z_OK) RT_THROW("idx file '", path.string(), "': reading failed (zlib status ", close_status, ")");
  return bytes;
}

uint32_t big_endian(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) | b[at + 3];
}

void check_magic(const fs::path& path, const std::vector<uint8_t>& bytes, uint32_t expected, const char* what) {
  if (bytes.size() < 4) RT_THROW("idx file '", path.string(), "' is truncated: ", bytes.size(), " bytes");
  const uint32_t magic = big_endian(bytes, 0);
  if (magic != expected) {
    char text[64];
    std::snprintf(text, sizeof text, "0x%08x, expected 0x%08x", magic, expected);
    RT_THROW("idx file '", path.string(), "' is not an idx ", what, " file (bad magic ", text, ")");
  }
}

// Compares the byte count with header + payload, without overflowing on a garbage header.
void check_size(const fs::path& path, size_t actual, size_t header, const std::vector<uint64_t>& dims) {
  uint64_t payload = 1;
  for (uint64_t d : dims) {
    if (d != 0 && payload > (uint64_t{1} << 48) / d)
      RT_THROW("idx file '", path.string(), "' has an implausible header (dimensions too large)");
    payload *= d;
  }
  const uint64_t expected = header + payload;
  if (actual < expected)
    RT_THROW("idx file '", path.string(), "' is truncated: ", actual, " bytes, the header needs ", expected);
  if (actual > expected)
    RT_THROW("idx file '", path.string(), "' has ", actual - expected, " bytes after the ", expected,
             " the header describes");
}

}  // namespace

IdxImages read_idx_images(const fs::path& requested) {
  IdxImages out;
  out.path = resolve(requested);
  std::vector<uint8_t> bytes = read_all(out.path);
  check_magic(out.path, bytes, kImagesMagic, "image (idx3 uint8)");
  if (bytes.size() < 16) RT_THROW("idx file '", out.path.string(), "' is truncated: ", bytes.size(), " bytes");
  out.count = big_endian(bytes, 4);
  out.rows = big_endian(bytes, 8);
  out.cols = big_endian(bytes, 12);
  check_size(out.path, bytes.size(), 16,
             {static_cast<uint64_t>(out.count), static_cast<uint64_t>(out.rows), static_cast<uint64_t>(out.cols)});
  bytes.erase(bytes.begin(), bytes.begin() + 16);
  out.pixels = std::move(bytes);
  return out;
}

IdxLabels read_idx_labels(const fs::path& requested) {
  IdxLabels out;
  out.path = resolve(requested);
  std::vector<uint8_t> bytes = read_all(out.path);
  check_magic(out.path, bytes, kLabelsMagic, "label (idx1 uint8)");
  if (bytes.size() < 8) RT_THROW("idx file '", out.path.string(), "' is truncated: ", bytes.size(), " bytes");
  out.count = big_endian(bytes, 4);
  check_size(out.path, bytes.size(), 8, {static_cast<uint64_t>(out.count)});
  bytes.erase(bytes.begin(), bytes.begin() + 8);
  out.labels = std::move(bytes);
  return out;
}

IdxSplit read_idx_split(const fs::path& images_path, const fs::path& labels_path) {
  IdxSplit split{read_idx_images(images_path), read_idx_labels(labels_path)};
  if (split.images.count != split.labels.count)
    RT_THROW("idx files disagree: '", split.images.path.string(), "' has ", split.images.count, " images but '",
             split.labels.path.string(), "' has ", split.labels.count, " labels");
  return split;
}

}  // namespace ringtrain::data
