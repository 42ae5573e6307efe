// data/converters.cpp: the source-format converters (see converters.h). Each reads and checks its
// sources before the first ShardWriter is created where that is cheap (idx, CIFAR), so a bad test
// file does not leave a half-written dataset behind.
#include "data/converters.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <map>

#include "core/allocator.h"
#include "core/check.h"
#include "core/parallel.h"
#include "core/philox.h"
#include "data/codec.h"
#include "data/idx.h"
#include "data/shard_format.h"

namespace ringtrain::data {
namespace fs = std::filesystem;

namespace {

std::string absolute_text(const fs::path& path) { return fs::absolute(path).lexically_normal().string(); }

void require_directory(const fs::path& dir, const char* what) {
  if (!fs::is_directory(dir)) RT_THROW(what, " folder '", dir.string(), "' does not exist or is not a folder");
}

std::vector<uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) RT_THROW("cannot open '", path.string(), "'");
  std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) RT_THROW("reading '", path.string(), "' failed");
  return bytes;
}

// Class names, one per non-empty line (trailing whitespace ignored); empty when the file is absent.
std::vector<std::string> read_class_names(const fs::path& path, int expected) {
  if (!fs::exists(path)) return {};
  std::ifstream in(path);
  if (!in) RT_THROW("cannot open class name file '", path.string(), "'");
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  if (static_cast<int>(names.size()) != expected)
    RT_THROW("class name file '", path.string(), "' has ", names.size(), " names, expected ", expected);
  return names;
}

WriterOptions writer_options(const fs::path& out, const std::string& split, int shards, int64_t records, int64_t height,
                             int64_t width, int64_t channels, int num_classes, std::vector<std::string> classes,
                             const std::string& source, bool show_progress) {
  WriterOptions w;
  w.dir = out;
  w.split = split;
  w.num_shards = shards;
  w.total_records = records;
  w.height = height;
  w.width = width;
  w.channels = channels;
  w.num_classes = num_classes;
  w.classes = std::move(classes);
  w.source = source;
  w.show_progress = show_progress;
  return w;
}

void check_shard_count(const ConvertOptions& options, int64_t largest_records, const std::string& split) {
  if (options.num_shards < 1) RT_THROW("--shards must be at least 1, got ", options.num_shards);
  if (options.num_shards > largest_records)
    RT_THROW("--shards ", options.num_shards, " is more than the ", largest_records, " records of split '", split,
             "': a shard holds at least one record, so use 1 to ", largest_records, " shards");
}

// ------------------------------------------------------------------------------------------------ idx

const std::vector<std::string>& idx_class_names(const std::string& name) {
  static const std::vector<std::string> kFashion = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  static const std::vector<std::string> kDigits = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  if (name == "fashion-mnist") return kFashion;
  if (name == "mnist") return kDigits;
  RT_THROW("unknown idx dataset '", name, "' (expected fashion-mnist or mnist)");
}

// ---------------------------------------------------------------------------------------------- CIFAR

constexpr int64_t kCifarSide = 32, kCifarChannels = 3, kCifarPixels = kCifarSide * kCifarSide * kCifarChannels;

struct CifarLayout {
  int num_classes;
  int64_t label_bytes;  // 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine)
  std::string subdir;   // the folder the official archive extracts to
  std::vector<std::string> train_files, test_files;
  std::string names_file;
  int64_t record_bytes() const { return label_bytes + kCifarPixels; }
};

CifarLayout cifar_layout(int num_classes) {
  if (num_classes == 10)
    return {10,
            1,
            "cifar-10-batches-bin",
            {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"},
            {"test_batch.bin"},
            "batches.meta.txt"};
  if (num_classes == 100) return {100, 2, "cifar-100-binary", {"train.bin"}, {"test.bin"}, "fine_label_names.txt"};
  RT_THROW("CIFAR has 10 or 100 classes, got ", num_classes);
}

// src itself, or the archive's folder inside it, whichever holds the first train file.
fs::path find_cifar_dir(const fs::path& src, const CifarLayout& layout) {
  require_directory(src, "CIFAR source");
  const std::string& marker = layout.train_files.front();
  if (fs::exists(src / marker)) return src;
  if (fs::exists(src / layout.subdir / marker)) return src / layout.subdir;
  RT_THROW("CIFAR-", layout.num_classes, " file '", (src / marker).string(), "' not found (nor '",
           (src / layout.subdir / marker).string(), "')");
}

int64_t cifar_records(const fs::path& path, const CifarLayout& layout) {
  if (!fs::exists(path)) RT_THROW("CIFAR-", layout.num_classes, " file '", path.string(), "' not found");
  const auto bytes = static_cast<int64_t>(fs::file_size(path));
  if (bytes == 0 || bytes % layout.record_bytes() != 0)
    RT_THROW("CIFAR-", layout.num_classes, " file '", path.string(), "' is ", bytes, " bytes, not a whole number of ",
             layout.record_bytes(), "-byte records (truncated?)");
  return bytes / layout.record_bytes();
}

// ----------------------------------------------------------------------------------------- imagefolder

bool is_hidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

bool has_image_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// Sorted names of the visible subfolders of dir.
std::vector<std::string> subfolder_names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_directory() && !is_hidden(entry.path())) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

struct ImageRecord {
  fs::path path;
  int32_t label = 0;
};

struct FolderSplit {
  std::string name;
  fs::path dir;
  std::vector<ImageRecord> records;  // sorted by class, then path; shuffled before writing
};

// Collects the images of one split folder. Class folders must be among `classes` (the train split's);
// in the train split every class must have at least one image.
void collect_images(FolderSplit& split, const std::vector<std::string>& classes, bool require_every_class,
                    std::vector<std::string>& notes) {
  std::map<std::string, int32_t> class_index;
  for (size_t i = 0; i < classes.size(); ++i) class_index[classes[i]] = static_cast<int32_t>(i);
  int64_t skipped = 0, outside = 0;
  fs::path first_skipped, first_outside;
  auto skip = [&](const fs::path& path) {
    if (skipped++ == 0) first_skipped = path;
  };
  // Files beside the class folders belong to no class (whatever their extension).
  for (const auto& entry : fs::directory_iterator(split.dir))
    if (!entry.is_directory() && !is_hidden(entry.path()) && outside++ == 0) first_outside = entry.path();
  for (const std::string& name : subfolder_names(split.dir)) {
    const fs::path class_dir = split.dir / name;
    auto found = class_index.find(name);
    if (found == class_index.end())
      RT_THROW("class folder '", class_dir.string(), "' is not one of the ", classes.size(),
               " classes found in the train split");
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(class_dir, fs::directory_options::follow_directory_symlink);
         it != fs::recursive_directory_iterator(); ++it) {
      if (is_hidden(it->path())) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_directory()) continue;
      if (it->is_regular_file() && has_image_extension(it->path()))
        files.push_back(it->path());
      else
        skip(it->path());
    }
    if (files.empty() && require_every_class)
      RT_THROW("class folder '", class_dir.string(), "' has no .jpg/.jpeg/.png images");
    std::sort(files.begin(), files.end());
    for (fs::path& file : files) split.records.push_back({std::move(file), found->second});
  }
  if (split.records.empty()) RT_THROW("image folder '", split.dir.string(), "' has no .jpg/.jpeg/.png images");
  if (skipped > 0)
    notes.push_back(detail::str_cat("split '", split.name, "': skipped ", skipped,
                                    " files that are not .jpg/.jpeg/.png (first: ", first_skipped.string(), ")"));
  if (outside > 0)
    notes.push_back(detail::str_cat("split '", split.name, "': skipped ", outside, " files outside the class folders, ",
                                    "which belong to no class (first: ", first_outside.string(), ")"));
}

// One image ready for the writer: decoded+resized pixels, or encoded bytes plus their decoded shape and
// statistics.
struct PreparedImage {
  std::vector<uint8_t> data;
  int64_t hwc[3] = {0, 0, 0};
  std::vector<double> sums, squares;
  std::string warning;  // libjpeg's first warning while decoding it ("" when it decoded clean)
};

PreparedImage prepare_image(const fs::path& path, const ImageFolderOptions& options) {
  try {
    std::vector<uint8_t> bytes = read_file(path);
    DecodedImage decoded = decode_image(bytes.data(), bytes.size());
    if (decoded.warnings > 0 && options.strict)
      RT_THROW("libjpeg: ", decoded.first_warning, " (", decoded.warnings,
               " warning(s): parts of the image are damaged; ", "--strict refuses such images)");
    const std::string warning = decoded.warnings > 0 ? decoded.first_warning : "";
    const bool same_channels = decoded.channels == options.channels;
    const DecodedImage image = convert_channels(std::move(decoded), options.channels);
    PreparedImage prepared;
    prepared.warning = warning;
    const int64_t c = options.channels;
    // The statistics of the pixels stored (before any JPEG encoding): the writer turns them into mean/std.
    auto add_statistics = [&](const std::vector<uint8_t>& pixels) {
      prepared.sums.assign(static_cast<size_t>(c), 0.0);
      prepared.squares.assign(static_cast<size_t>(c), 0.0);
      format::add_channel_sums(pixels.data(), static_cast<int64_t>(pixels.size()), c, prepared.sums, prepared.squares);
    };
    if (options.size == 0) {
      // The image as it is: its own bytes (re-encoded only when its channels must change), its own size.
      prepared.hwc[0] = image.height, prepared.hwc[1] = image.width, prepared.hwc[2] = c;
      add_statistics(image.pixels);
      prepared.data = same_channels
                          ? std::move(bytes)
                          : encode_jpeg(image.pixels.data(), image.height, image.width, c, options.jpeg_quality);
      return prepared;
    }
    prepared.data =
        resize_shorter_side_center_crop(image.pixels.data(), image.height, image.width, image.channels, options.size);
    prepared.hwc[0] = prepared.hwc[1] = options.size, prepared.hwc[2] = c;
    if (options.storage == ImageStorage::kJpeg) {
      add_statistics(prepared.data);
      prepared.data = encode_jpeg(prepared.data.data(), options.size, options.size, c, options.jpeg_quality);
    }
    return prepared;
  } catch (const std::exception& e) {
    RT_THROW("image '", path.string(), "': ", e.what());
  }
}

SplitInfo write_image_split(const FolderSplit& split, const fs::path& out, int shards, int num_classes,
                            const std::vector<std::string>& classes, const std::string& source,
                            const ImageFolderOptions& image_options, const ConvertOptions& options, uint64_t stream,
                            std::vector<std::string>& notes) {
  int64_t damaged = 0;
  std::string first_damaged;
  WriterOptions w =
      writer_options(out, split.name, shards, static_cast<int64_t>(split.records.size()), image_options.size,
                     image_options.size, image_options.channels, num_classes, classes, source, options.show_progress);
  w.encoded = image_options.storage == ImageStorage::kJpeg;
  ShardWriter writer(std::move(w));
  const std::vector<int64_t> order = shuffled_order(static_cast<int64_t>(split.records.size()), options.seed, stream);
  const int64_t batch = 32 * static_cast<int64_t>(num_threads());
  for (int64_t begin = 0; begin < static_cast<int64_t>(order.size()); begin += batch) {
    const int64_t count = std::min<int64_t>(batch, static_cast<int64_t>(order.size()) - begin);
    // Decoding dominates; the pool decodes a batch, then records go to the writer in order.
    std::vector<PreparedImage> prepared(static_cast<size_t>(count));
    parallel_for(count, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        prepared[static_cast<size_t>(i)] = prepare_image(
            split.records[static_cast<size_t>(order[static_cast<size_t>(begin + i)])].path, image_options);
    });
    for (int64_t i = 0; i < count; ++i) {
      const ImageRecord& record = split.records[static_cast<size_t>(order[static_cast<size_t>(begin + i)])];
      PreparedImage& p = prepared[static_cast<size_t>(i)];
      if (!p.warning.empty() && damaged++ == 0) first_damaged = detail::str_cat(record.path.string(), ": ", p.warning);
      if (image_options.storage == ImageStorage::kJpeg)
        writer.add_encoded(p.data, p.hwc, record.label, p.sums, p.squares);
      else
        writer.add(p.data.data(), record.label);
    }
  }
  if (damaged > 0)
    notes.push_back(detail::str_cat("split '", split.name, "': ", damaged, " image(s) decoded with libjpeg warnings ",
                                    "(damaged data: parts of them are gray or garbled; first: ", first_damaged,
                                    "); make_shards imagefolder --strict refuses them"));
  return writer.finish();
}

// -------------------------------------------------------------------------------------------- synthetic

// Streams of the synthetic generator; templates are shared by all splits so they come from one
// distribution.
constexpr uint64_t kTemplateStream = 100;
constexpr uint64_t kNoiseStream[2] = {1, 2};  // train, test
constexpr uint64_t kLabelStream[2] = {11, 12};

// Bytes [first, first + n) of the philox byte sequence (16 bytes per block) of (seed, stream).
void philox_bytes(uint64_t seed, uint64_t stream, uint64_t first, int64_t n, uint8_t* out) {
  Philox4 block{};
  uint64_t block_index = ~uint64_t{0};
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t b = first + static_cast<uint64_t>(i);
    if (b / 16 != block_index) {
      block_index = b / 16;
      block = philox4x32_10(seed, block_index, stream);
    }
    out[i] = static_cast<uint8_t>(block.v[(b % 16) / 4] >> (8 * (b % 4)));
  }
}

}  // namespace

int shards_for_split(int num_shards, int64_t records, int64_t largest_records) {
  RT_CHECK(num_shards >= 1 && records >= 1 && largest_records >= records, "shards_for_split(", num_shards, ", ",
           records, ", ", largest_records, ")");
  const int64_t shards = (static_cast<int64_t>(num_shards) * records + largest_records - 1) / largest_records;
  return static_cast<int>(std::clamp<int64_t>(shards, 1, records));
}

std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    // 64 random bits per draw: the modulo bias is below 2^-30 for any n a dataset can have.
    const Philox4 r = philox4x32_10(seed, static_cast<uint64_t>(i), stream);
    const uint64_t bits = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
    const auto j = static_cast<int64_t>(bits % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

ConvertResult convert_idx(const fs::path& src, const fs::path& out, const std::string& name,
                          const ConvertOptions& options) {
  const std::vector<std::string>& classes = idx_class_names(name);
  require_directory(src, "idx source");
  // Read and check both splits before writing anything.
  struct Source {
    const char* split;
    IdxSplit data;
  };
  std::vector<Source> sources;
  sources.push_back({"train", read_idx_split(src / "train-images-idx3-ubyte", src / "train-labels-idx1-ubyte")});
  sources.push_back({"test", read_idx_split(src / "t10k-images-idx3-ubyte", src / "t10k-labels-idx1-ubyte")});
  for (const Source& s : sources) {
    if (s.data.images.count == 0) RT_THROW("idx file '", s.data.images.path.string(), "' has no images");
    for (int64_t i = 0; i < s.data.labels.count; ++i)
      if (s.data.labels.labels[static_cast<size_t>(i)] >= classes.size())
        RT_THROW("idx file '", s.data.labels.path.string(), "': label ",
                 int{s.data.labels.labels[static_cast<size_t>(i)]}, " of record ", i, " is outside [0, ",
                 classes.size(), ")");
  }
  const int64_t largest = sources[0].data.images.count;
  check_shard_count(options, largest, "train");
  const std::string source = name + ":" + absolute_text(src);
  ConvertResult result;
  for (const Source& s : sources) {
    const IdxImages& images = s.data.images;
    const int64_t records = images.count, record_bytes = images.rows * images.cols;
    ShardWriter writer(writer_options(
        out, s.split, shards_for_split(options.num_shards, records, std::max(largest, records)), records, images.rows,
        images.cols, 1, static_cast<int>(classes.size()), classes, source, options.show_progress));
    for (int64_t i = 0; i < records; ++i)
      writer.add(images.pixels.data() + i * record_bytes, s.data.labels.labels[static_cast<size_t>(i)]);
    result.splits.push_back(writer.finish());
  }
  return result;
}

ConvertResult convert_cifar(const fs::path& src, const fs::path& out, int num_classes, const ConvertOptions& options) {
  const CifarLayout layout = cifar_layout(num_classes);
  const fs::path dir = find_cifar_dir(src, layout);
  // Sizes of every file first: a missing test file fails before the train split is written.
  struct Split {
    const char* name;
    std::vector<fs::path> files;
    int64_t records = 0;
  };
  std::vector<Split> splits = {{"train", {}, 0}, {"test", {}, 0}};
  for (const std::string& f : layout.train_files) splits[0].files.push_back(dir / f);
  for (const std::string& f : layout.test_files) splits[1].files.push_back(dir / f);
  for (Split& split : splits)
    for (const fs::path& file : split.files) split.records += cifar_records(file, layout);
  const int64_t largest = std::max(splits[0].records, splits[1].records);
  check_shard_count(options, splits[0].records, "train");

  ConvertResult result;
  const std::vector<std::string> classes = read_class_names(dir / layout.names_file, num_classes);
  if (classes.empty()) result.notes.push_back("no class names: '" + (dir / layout.names_file).string() + "' not found");
  const std::string source = "cifar" + std::to_string(num_classes) + ":" + absolute_text(dir);
  std::vector<uint8_t> hwc(static_cast<size_t>(kCifarPixels));
  constexpr int64_t kPlane = kCifarSide * kCifarSide;
  for (const Split& split : splits) {
    ShardWriter writer(writer_options(out, split.name, shards_for_split(options.num_shards, split.records, largest),
                                      split.records, kCifarSide, kCifarSide, kCifarChannels, num_classes, classes,
                                      source, options.show_progress));
    for (const fs::path& file : split.files) {
      const std::vector<uint8_t> bytes = read_file(file);
      // The size was checked above; a file that changed since is caught here.
      if (static_cast<int64_t>(bytes.size()) % layout.record_bytes() != 0)
        RT_THROW("CIFAR file '", file.string(), "' changed size while converting");
      const int64_t records = static_cast<int64_t>(bytes.size()) / layout.record_bytes();
      for (int64_t r = 0; r < records; ++r) {
        const uint8_t* record = bytes.data() + r * layout.record_bytes();
        const int label = record[layout.label_bytes - 1];  // CIFAR-100: the fine label is the second byte
        if (label >= num_classes)
          RT_THROW("CIFAR file '", file.string(), "': label ", label, " of record ", r, " is outside [0, ", num_classes,
                   ")");
        // CHW planes (all red, all green, all blue; each row-major 32x32) -> HWC.
        const uint8_t* planes = record + layout.label_bytes;
        for (int64_t p = 0; p < kPlane; ++p)
          for (int64_t c = 0; c < kCifarChannels; ++c)
            hwc[static_cast<size_t>(p * kCifarChannels + c)] = planes[c * kPlane + p];
        writer.add(hwc.data(), label);
      }
    }
    result.splits.push_back(writer.finish());
  }
  return result;
}

ConvertResult convert_imagefolder(const fs::path& src, const fs::path& out, const ImageFolderOptions& image_options,
                                  const ConvertOptions& options) {
  require_directory(src, "image folder source");
  if (image_options.size < 0)
    RT_THROW("image size must be at least 1 (or 0: each image's own size), got ", image_options.size);
  if (image_options.size == 0 && image_options.storage != ImageStorage::kJpeg)
    RT_THROW(
        "image size 0 (each image's own size) needs encoded storage (--encode jpeg): decoded pixels need one shape");
  if (image_options.channels != 1 && image_options.channels != 3)
    RT_THROW("image channels must be 1 or 3, got ", image_options.channels);
  if (image_options.jpeg_quality < 1 || image_options.jpeg_quality > 100)
    RT_THROW("JPEG quality must be in 1..100, got ", image_options.jpeg_quality);

  ConvertResult result;
  std::vector<FolderSplit> splits;
  if (fs::is_directory(src / "train")) {
    splits.push_back({"train", src / "train", {}});
    for (const char* other : {"val", "test"})
      if (fs::is_directory(src / other)) splits.push_back({other, src / other, {}});
    for (const std::string& name : subfolder_names(src))
      if (name != "train" && name != "val" && name != "test")
        result.notes.push_back("ignored folder '" + (src / name).string() + "' (splits are train, val, test)");
  } else {
    splits.push_back({"train", src, {}});
  }
  const std::vector<std::string> classes = subfolder_names(splits[0].dir);
  if (classes.empty()) RT_THROW("image folder '", splits[0].dir.string(), "' has no class subfolders");
  for (size_t i = 0; i < splits.size(); ++i) collect_images(splits[i], classes, i == 0, result.notes);

  int64_t largest = 0;
  for (const FolderSplit& split : splits) largest = std::max(largest, static_cast<int64_t>(split.records.size()));
  check_shard_count(options, static_cast<int64_t>(splits[0].records.size()), "train");
  const std::string source = "imagefolder:" + absolute_text(src);
  for (size_t i = 0; i < splits.size(); ++i) {
    const int shards = shards_for_split(options.num_shards, static_cast<int64_t>(splits[i].records.size()), largest);
    result.splits.push_back(write_image_split(splits[i], out, shards, static_cast<int>(classes.size()), classes, source,
                                              image_options, options, /*stream=*/i, result.notes));
  }
  return result;
}

namespace {
// A synthetic set's raw records (train, and a fifth as many for test) must fit the free space of the device
// `out` is on: said before the first byte, not when the disk refuses hours later (--count 4294967297).
void check_room(const fs::path& out, int64_t count, int64_t record_bytes, const char* what) {
  const double records = static_cast<double>(count) + static_cast<double>(std::max<int64_t>(1, count / 5));
  const double need = records * static_cast<double>(record_bytes);
  fs::path at = fs::absolute(out);
  while (!at.empty() && at != at.parent_path() && !fs::exists(at)) at = at.parent_path();
  std::error_code ec;
  const fs::space_info room = fs::space(at, ec);
  if (ec || need <= static_cast<double>(room.available)) return;
  RT_THROW(what, ": ", static_cast<int64_t>(records), " records of ", format_bytes(record_bytes), " need about ",
           need >= 9e18 ? std::string("8 EiB or more") : format_bytes(static_cast<int64_t>(need)), ", but '",
           at.string(), "' has ", format_bytes(static_cast<int64_t>(room.available)),
           " free: lower --count or the image size, or write elsewhere");
}
}  // namespace

ConvertResult convert_synthetic(const fs::path& out, const SyntheticSpec& spec, const ConvertOptions& options) {
  if (spec.height < 1 || spec.width < 1 || spec.channels < 1)
    RT_THROW("synthetic image shape must be positive, got ", spec.height, "x", spec.width, "x", spec.channels);
  if (spec.count < 1) RT_THROW("synthetic record count must be at least 1, got ", spec.count);
  if (spec.num_classes < 1) RT_THROW("synthetic class count must be at least 1, got ", spec.num_classes);
  const bool jpeg = spec.storage == ImageStorage::kJpeg;
  if (jpeg && spec.channels != 1 && spec.channels != 3)
    RT_THROW("synthetic --encode jpeg needs 1 or 3 channels, got ", spec.channels);
  if (jpeg && (spec.jpeg_quality < 1 || spec.jpeg_quality > 100))
    RT_THROW("synthetic JPEG quality must be from 1 to 100, got ", spec.jpeg_quality);
  check_shard_count(options, spec.count, "train");
  const int64_t record_bytes = spec.height * spec.width * spec.channels;
  if (!jpeg) check_room(out, spec.count, record_bytes, "synthetic");  // JPEG's size is not known ahead
  std::vector<uint8_t> templates(static_cast<size_t>(spec.num_classes * record_bytes));
  philox_bytes(options.seed, kTemplateStream, 0, static_cast<int64_t>(templates.size()), templates.data());
  const std::string source =
      detail::str_cat("synthetic:", spec.height, "x", spec.width, "x", spec.channels, ",count=", spec.count,
                      ",classes=", spec.num_classes, ",seed=", options.seed);
  ConvertResult result;
  const int64_t counts[2] = {spec.count, std::max<int64_t>(1, spec.count / 5)};
  const char* names[2] = {"train", "test"};
  std::vector<uint8_t> image(static_cast<size_t>(record_bytes));
  for (int s = 0; s < 2; ++s) {
    WriterOptions wo =
        writer_options(out, names[s], shards_for_split(options.num_shards, counts[s], spec.count), counts[s],
                       spec.height, spec.width, spec.channels, spec.num_classes, {}, source, options.show_progress);
    wo.encoded = jpeg;
    ShardWriter writer(wo);
    for (int64_t r = 0; r < counts[s]; ++r) {
      const Philox4 label_bits = philox4x32_10(options.seed, static_cast<uint64_t>(r), kLabelStream[s]);
      const auto label = static_cast<int32_t>(label_bits.v[0] % static_cast<uint32_t>(spec.num_classes));
      philox_bytes(options.seed, kNoiseStream[s], static_cast<uint64_t>(r * record_bytes), record_bytes, image.data());
      const uint8_t* t = templates.data() + label * record_bytes;
      for (int64_t i = 0; i < record_bytes; ++i)
        image[static_cast<size_t>(i)] = static_cast<uint8_t>((image[static_cast<size_t>(i)] + t[i] + 1) / 2);
      if (!jpeg) {
        writer.add(image.data(), label);
        continue;
      }
      std::vector<double> sums(static_cast<size_t>(spec.channels), 0.0), squares(sums.size(), 0.0);
      format::add_channel_sums(image.data(), record_bytes, spec.channels, sums, squares);
      const int64_t hwc[3] = {spec.height, spec.width, spec.channels};
      writer.add_encoded(encode_jpeg(image.data(), spec.height, spec.width, spec.channels, spec.jpeg_quality), hwc,
                         label, sums, squares);
    }
    result.splits.push_back(writer.finish());
  }
  return result;
}

// ------------------------------------------------------------------------------------------------ segmentation

namespace {

struct MaskedRecord {
  fs::path image, mask;
};

// The (image, mask) pairs of one split folder (images/ and masks/ under dir), by name.
std::vector<MaskedRecord> collect_masked(const fs::path& dir, std::vector<std::string>& notes) {
  const fs::path images = dir / "images", masks = dir / "masks";
  for (const fs::path& d : {images, masks})
    if (!fs::is_directory(d))
      RT_THROW("segmentation folder '", dir.string(), "' has no '", d.filename().string(),
               "' folder (expected images/<name>.jpg|png and masks/<name>.png)");
  std::map<std::string, fs::path> image_of, mask_of;
  int64_t skipped = 0;
  for (const auto& [folder, table] : {std::pair{images, &image_of}, std::pair{masks, &mask_of}}) {
    for (const auto& entry : fs::directory_iterator(folder)) {
      if (!entry.is_regular_file() || is_hidden(entry.path())) continue;
      if (!has_image_extension(entry.path())) {
        ++skipped;
        continue;
      }
      const std::string stem = entry.path().stem().string();
      if (!table->emplace(stem, entry.path()).second)
        RT_THROW("'", entry.path().string(), "' and '", (*table)[stem].string(), "' share the name '", stem,
                 "': which is the record's?");
    }
  }
  std::vector<MaskedRecord> records;
  for (const auto& [stem, image] : image_of) {
    auto it = mask_of.find(stem);
    if (it == mask_of.end())
      RT_THROW("image '", image.string(), "' has no mask '", (masks / (stem + ".png")).string(), "'");
    records.push_back({image, it->second});
  }
  for (const auto& [stem, mask] : mask_of)
    if (!image_of.count(stem)) RT_THROW("mask '", mask.string(), "' has no image '", (images / stem).string(), ".*'");
  if (records.empty()) RT_THROW("segmentation folder '", dir.string(), "' holds no images");
  if (skipped > 0)
    notes.push_back(detail::str_cat("'", dir.string(), "': skipped ", skipped, " files that are not .jpg/.jpeg/.png"));
  return records;
}

// A mask as imagefolder's resize treats its image (shorter side to size, the central window), by the nearest
// pixel: each output pixel's centre mapped back onto the source.
std::vector<uint8_t> resize_mask(const uint8_t* mask, int64_t height, int64_t width, int64_t size) {
  const double scale = static_cast<double>(size) / static_cast<double>(std::min(height, width));
  const double off_y = (height * scale - static_cast<double>(size)) / 2,
               off_x = (width * scale - static_cast<double>(size)) / 2;
  std::vector<uint8_t> out(static_cast<size_t>(size * size));
  for (int64_t y = 0; y < size; ++y) {
    const int64_t sy = std::clamp<int64_t>(static_cast<int64_t>((y + 0.5 + off_y) / scale), 0, height - 1);
    for (int64_t x = 0; x < size; ++x) {
      const int64_t sx = std::clamp<int64_t>(static_cast<int64_t>((x + 0.5 + off_x) / scale), 0, width - 1);
      out[static_cast<size_t>(y * size + x)] = mask[sy * width + sx];
    }
  }
  return out;
}

struct MaskedImage {
  std::vector<uint8_t> image, mask;
  int64_t height = 0, width = 0;
};

MaskedImage prepare_masked(const MaskedRecord& r, const SegmentationFolderOptions& o) {
  MaskedImage m;
  DecodedImage image;
  try {
    const std::vector<uint8_t> bytes = read_file(r.image);
    image = convert_channels(decode_image(bytes.data(), bytes.size()), o.channels);
  } catch (const std::exception& e) {
    RT_THROW("image '", r.image.string(), "': ", e.what());
  }
  DecodedImage mask;
  try {
    const std::vector<uint8_t> bytes = read_file(r.mask);
    mask = decode_mask(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    RT_THROW("mask '", r.mask.string(), "': ", e.what());
  }
  if (mask.height != image.height || mask.width != image.width)
    RT_THROW("mask '", r.mask.string(), "' is ", mask.height, "x", mask.width, " but its image '", r.image.string(),
             "' is ", image.height, "x", image.width);
  if (o.size > 0) {
    m.image = resize_shorter_side_center_crop(image.pixels.data(), image.height, image.width, o.channels, o.size);
    m.mask = resize_mask(mask.pixels.data(), mask.height, mask.width, o.size);
    m.height = m.width = o.size;
  } else {
    m.image = std::move(image.pixels);
    m.mask = std::move(mask.pixels);
    m.height = image.height;
    m.width = image.width;
  }
  return m;
}

}  // namespace

ConvertResult convert_segmentation_folder(const fs::path& src, const fs::path& out, const SegmentationFolderOptions& o,
                                          const ConvertOptions& options) {
  if (o.channels != 1 && o.channels != 3) RT_THROW("segmentation --channels must be 1 or 3, got ", o.channels);
  if (o.size < 0 || o.num_classes < 0 || o.num_classes > 255)
    RT_THROW("segmentation --size must be >= 0 and --classes from 0 (from the masks) to 255");
  ConvertResult result;
  std::vector<std::pair<std::string, std::vector<MaskedRecord>>> splits;
  if (fs::is_directory(src / "train")) {
    for (const char* name : {"train", "val", "test"})
      if (fs::is_directory(src / name)) splits.emplace_back(name, collect_masked(src / name, result.notes));
  } else {
    splits.emplace_back("train", collect_masked(src, result.notes));
  }
  // The records decoded once: the class count and the common size come from them before any shard is written.
  std::vector<std::vector<MaskedImage>> prepared(splits.size());
  int max_class = -1;
  int64_t height = 0, width = 0;
  for (size_t s = 0; s < splits.size(); ++s) {
    const auto& records = splits[s].second;
    prepared[s].resize(records.size());
    parallel_for(static_cast<int64_t>(records.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        prepared[s][static_cast<size_t>(i)] = prepare_masked(records[static_cast<size_t>(i)], o);
    });
    for (size_t i = 0; i < records.size(); ++i) {
      const MaskedImage& m = prepared[s][i];
      if (height == 0) height = m.height, width = m.width;
      if (m.height != height || m.width != width)
        RT_THROW("image '", records[i].image.string(), "' is ", m.height, "x", m.width, " but the first is ", height,
                 "x", width, ": give --size to resize them to one size");
      if (s == 0)
        for (uint8_t v : m.mask)
          if (v != 255) max_class = std::max(max_class, static_cast<int>(v));
    }
  }
  const int classes = o.num_classes > 0 ? o.num_classes : max_class + 1;
  if (classes < 1) RT_THROW("the train masks of '", src.string(), "' hold no class (every pixel 255): give --classes");
  const std::string source = detail::str_cat("segmentation:", src.string(), ",size=", o.size, ",channels=", o.channels);
  int64_t largest = 0;
  for (const auto& [name, records] : splits) largest = std::max(largest, static_cast<int64_t>(records.size()));
  check_shard_count(options, static_cast<int64_t>(splits[0].second.size()), "train");
  for (size_t s = 0; s < splits.size(); ++s) {
    const auto& [name, records] = splits[s];
    WriterOptions w = writer_options(
        out, name, shards_for_split(options.num_shards, static_cast<int64_t>(records.size()), largest),
        static_cast<int64_t>(records.size()), height, width, o.channels, classes, {}, source, options.show_progress);
    w.segmentation = true;
    ShardWriter writer(std::move(w));
    const std::vector<int64_t> order = shuffled_order(static_cast<int64_t>(records.size()), options.seed, 40 + s);
    for (int64_t i : order) {
      const MaskedImage& m = prepared[s][static_cast<size_t>(i)];
      try {
        writer.add(m.image.data(), 0, m.mask.data());
      } catch (const Error& e) {
        RT_THROW("mask '", records[static_cast<size_t>(i)].mask.string(), "': ", e.what(),
                 o.num_classes > 0 ? "" : " (the class count came from the train masks: give --classes)");
      }
    }
    result.splits.push_back(writer.finish());
  }
  return result;
}

ConvertResult convert_synthetic_segmentation(const fs::path& out, const SyntheticSegmentationSpec& spec,
                                             const ConvertOptions& options) {
  if (spec.size < 8 || spec.size > 4096 || (spec.channels != 1 && spec.channels != 3))
    RT_THROW("synthetic segmentation: --size must be from 8 to 4096 and --channels 1 or 3, got ", spec.size, " and ",
             spec.channels);
  if (spec.count < 1) RT_THROW("synthetic segmentation: --count must be at least 1, got ", spec.count);
  if (spec.num_classes < 2 || spec.num_classes > 255)
    RT_THROW("synthetic segmentation: --classes must be from 2 to 255 (class 0 is the background), got ",
             spec.num_classes);
  check_shard_count(options, spec.count, "train");
  const int64_t n = spec.size, c = spec.channels;
  check_room(out, spec.count, n * n * (c + 1), "synthetic-segmentation");  // image and mask
  // Each class's colour, fixed for the dataset.
  std::vector<uint8_t> colours(static_cast<size_t>(spec.num_classes * c));
  philox_bytes(options.seed, kTemplateStream, 0, static_cast<int64_t>(colours.size()), colours.data());
  const std::string source = detail::str_cat("synthetic-segmentation:", n, "x", n, "x", c, ",count=", spec.count,
                                             ",classes=", spec.num_classes, ",seed=", options.seed);
  ConvertResult result;
  const int64_t counts[2] = {spec.count, std::max<int64_t>(1, spec.count / 5)};
  const char* names[2] = {"train", "test"};
  std::vector<uint8_t> image(static_cast<size_t>(n * n * c)), mask(static_cast<size_t>(n * n)), noise(image.size());
  for (int s = 0; s < 2; ++s) {
    WriterOptions w = writer_options(out, names[s], shards_for_split(options.num_shards, counts[s], spec.count),
                                     counts[s], n, n, c, spec.num_classes, {}, source, options.show_progress);
    w.segmentation = true;
    ShardWriter writer(std::move(w));
    for (int64_t r = 0; r < counts[s]; ++r) {
      std::fill(mask.begin(), mask.end(), uint8_t{0});
      // Up to four shapes: class, kind (rectangle or disc), centre and half-size, from one Philox block each.
      for (uint64_t k = 0; k < 4; ++k) {
        const Philox4 b = philox4x32_10(options.seed, static_cast<uint64_t>(r) * 8 + k, kLabelStream[s]);
        if (k > 0 && (b.v[0] & 3u) == 0) continue;  // fewer shapes in some images
        const auto cls = static_cast<uint8_t>(1 + (b.v[0] >> 2) % static_cast<uint32_t>(spec.num_classes - 1));
        const bool disc = (b.v[0] >> 16) & 1u;
        const int64_t cy = b.v[1] % static_cast<uint32_t>(n), cx = b.v[2] % static_cast<uint32_t>(n);
        const int64_t half = n / 10 + b.v[3] % static_cast<uint32_t>(std::max<int64_t>(1, n / 4));
        for (int64_t y = std::max<int64_t>(0, cy - half); y < std::min(n, cy + half + 1); ++y)
          for (int64_t x = std::max<int64_t>(0, cx - half); x < std::min(n, cx + half + 1); ++x)
            if (!disc || (y - cy) * (y - cy) + (x - cx) * (x - cx) <= half * half)
              mask[static_cast<size_t>(y * n + x)] = cls;
      }
      philox_bytes(options.seed, kNoiseStream[s], static_cast<uint64_t>(r * n * n * c), n * n * c, noise.data());
      for (int64_t p = 0; p < n * n; ++p)
        for (int64_t k = 0; k < c; ++k) {
          const size_t i = static_cast<size_t>(p * c + k);
          image[i] = static_cast<uint8_t>(
              (3 * colours[static_cast<size_t>(mask[static_cast<size_t>(p)] * c + k)] + noise[i]) / 4);
        }
      writer.add(image.data(), 0, mask.data());
    }
    result.splits.push_back(writer.finish());
  }
  return result;
}

}  // namespace ringtrain::data
