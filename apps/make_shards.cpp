// apps/make_shards: the command line over data/converters.h. Converts Fashion-MNIST/MNIST idx files,
// CIFAR-10/100 binaries, a class-per-subfolder image tree, a folder of images and segmentation masks, or synthetic
// data (classification or segmentation) into ringtrain shards
// (docs/DATA_FORMAT.md), then prints a summary per split. Every split is validated by ShardWriter on
// finish, so a zero exit status means the dataset re-opened cleanly.
#include <CLI/CLI.hpp>
#include <new>

#include <cinttypes>
#include <cstdio>
#include <exception>
#include <string>

#include "core/allocator.h"
#include "data/converters.h"
#include "io/files.h"
#include "runtime/config/cli.h"

using namespace ringtrain;
using namespace ringtrain::data;

namespace {

struct CommonArgs {
  int shards = 1;
  uint64_t seed = 0;
  bool quiet = false;
};

void add_common_options(CLI::App* sub, CommonArgs& args) {
  runtime::add_number(*sub, "--shards", args.shards,
                      "Shards of the train split; smaller splits get proportionally fewer, at least 1", 1, 99999);
  runtime::add_number(*sub, "--seed", args.seed, "Seed for the imagefolder shuffle and synthetic data", uint64_t{0},
                      std::numeric_limits<uint64_t>::max());
  sub->add_flag("--quiet", args.quiet, "No progress line on stderr");
}

// "HxWxC" -> three positive sizes; empty string on success (CLI11's validator convention).
std::string parse_shape(const std::string& text, int64_t shape[3]) {
  const size_t x1 = text.find('x'), x2 = x1 == std::string::npos ? x1 : text.find('x', x1 + 1);
  if (x2 == std::string::npos) return "expected HxWxC, e.g. 32x32x3, got '" + text + "'";
  const std::optional<int64_t> h = to_number<int64_t>(text.substr(0, x1)),
                               w = to_number<int64_t>(text.substr(x1 + 1, x2 - x1 - 1)),
                               c = to_number<int64_t>(text.substr(x2 + 1));
  if (!h || !w || !c || *h < 1 || *w < 1 || *c < 1 || *h > 65536 || *w > 65536 || *c > 4096)
    return "expected HxWxC with sizes in 1..65536 (channels 1..4096), got '" + text + "'";
  shape[0] = *h, shape[1] = *w, shape[2] = *c;
  return "";
}

std::string floats_text(const std::vector<float>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%s%.4f", i ? ", " : "", static_cast<double>(values[i]));
    text += buffer;
  }
  return text + "]";
}

void print_summary(const ConvertResult& result, const std::string& out) {
  for (const std::string& note : result.notes) std::fprintf(stderr, "make_shards: note: %s\n", note.c_str());
  for (const SplitInfo& split : result.splits) {
    std::printf("%s: %" PRId64 " records in %zu shard%s, %s %s, %d classes, mean %s std %s\n", split.split.c_str(),
                split.records, split.shards.size(), split.shards.size() == 1 ? "" : "s", split.shape_text().c_str(),
                split.encoded        ? "encoded"
                : split.segmentation ? "pixels with masks"
                                     : "pixels",
                split.num_classes, floats_text(split.mean).c_str(), floats_text(split.std).c_str());
  }
  std::printf("wrote and validated %s/manifest.json\n", out.c_str());
}

}  // namespace

// What make_shards' flags can do when an allocation fails: synthetic data keeps one template image per class
// (--classes x --shape bytes); a converter writes a chunk of records at a time, so its largest image decides.
constexpr const char* kMemoryHint =
    "synthetic data keeps one template image per class: fewer --classes or a smaller --shape; converting a "
    "folder, its largest image must fit (--size resizes the records, not the decode)";

int main(int argc, char** argv) try {
  CLI::App app{"make_shards: converts a dataset into ringtrain HDF5 shards plus manifest.json (docs/DATA_FORMAT.md)"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  app.require_subcommand(1);

  std::string src, out;
  CommonArgs common;

  CLI::App* fashion = app.add_subcommand("fashion-mnist", "Fashion-MNIST idx files (gzipped or not) -> train, test");
  CLI::App* mnist = app.add_subcommand("mnist", "MNIST idx files (gzipped or not) -> train, test");
  CLI::App* cifar10 = app.add_subcommand("cifar10", "CIFAR-10 binary version (cifar-10-batches-bin) -> train, test");
  CLI::App* cifar100 =
      app.add_subcommand("cifar100", "CIFAR-100 binary version (cifar-100-binary), fine labels -> train, test");
  for (CLI::App* sub : {fashion, mnist, cifar10, cifar100}) {
    sub->add_option("SRC", src, "Source folder")->required()->check(CLI::ExistingDirectory);
    sub->add_option("OUT", out, "Output dataset folder (created if missing)")->required();
    add_common_options(sub, common);
  }
  fashion->footer("Debian's dataset-fashion-mnist installs the files in /usr/share/datasets/fashion-mnist.");

  ImageFolderOptions image_options;
  bool keep_encoded = false;
  CLI::App* imagefolder = app.add_subcommand(
      "imagefolder", "Class-per-subfolder JPEG/PNG tree: SRC/train/<class>/* (+ SRC/val, SRC/test) or SRC/<class>/*");
  imagefolder->add_option("SRC", src, "Source folder")->required()->check(CLI::ExistingDirectory);
  imagefolder->add_option("OUT", out, "Output dataset folder (created if missing)")->required();
  runtime::add_number(
      *imagefolder, "--size", image_options.size,
      "Output side: shorter side resized to S, then center-cropped to SxS; 0 (with --encode jpeg): every "
      "image kept as it is, at its own size (for random-resized crops when training, as for ImageNet)",
      0, 8192)
      ->required()
      ->default_str("");  // required: a default in --help would mislead
  runtime::add_number(*imagefolder, "--channels", image_options.channels,
                      "1 (grayscale) or 3 (RGB); other images are converted", 1, 3)
      ->check(CLI::IsMember({"1", "3"}));
  std::string encode = "raw";
  imagefolder->add_option("--encode", encode, "raw (decoded pixels) or jpeg (the resized images re-encoded)")
      ->capture_default_str()
      ->check(CLI::IsMember({"raw", "jpeg"}));
  imagefolder->add_flag("--keep-encoded", keep_encoded, "The same as --encode jpeg");
  runtime::add_number(*imagefolder, "--quality", image_options.jpeg_quality, "JPEG quality for --encode jpeg", 1, 100);
  imagefolder->add_flag("--strict", image_options.strict,
                        "Refuse images that decode only with libjpeg warnings (corrupt data) instead of counting them");
  add_common_options(imagefolder, common);

  SyntheticSpec spec;
  std::string shape_text = "32x32x3";
  int64_t shape[3] = {32, 32, 3};
  CLI::App* synthetic =
      app.add_subcommand("synthetic", "Random class templates plus noise (learnable) -> train, test (count/5)");
  synthetic->add_option("OUT", out, "Output dataset folder (created if missing)")->required();
  synthetic->add_option("--shape", shape_text, "Image shape HxWxC")
      ->check(CLI::Validator([&shape](std::string& text) { return parse_shape(text, shape); }, "HxWxC"));
  runtime::add_number(*synthetic, "--count", spec.count, "Train records", 1, int64_t{1} << 40);
  runtime::add_number(*synthetic, "--classes", spec.num_classes, "Number of classes", 1, 1 << 20);
  std::string synthetic_encode = "raw";
  synthetic
      ->add_option("--encode", synthetic_encode, "raw (pixels) or jpeg (each record JPEG-encoded; 1 or 3 channels)")
      ->capture_default_str()
      ->check(CLI::IsMember({"raw", "jpeg"}));
  runtime::add_number(*synthetic, "--quality", spec.jpeg_quality, "JPEG quality for --encode jpeg", 1, 100);
  add_common_options(synthetic, common);

  SegmentationFolderOptions segmentation_options;
  CLI::App* segmentation = app.add_subcommand(
      "segmentation",
      "Images and masks: SRC/images/<name>.jpg|png with SRC/masks/<name>.png (one channel of classes, 255 ignored), "
      "or both under SRC/train, SRC/val, SRC/test");
  segmentation->add_option("SRC", src, "Source folder")->required()->check(CLI::ExistingDirectory);
  segmentation->add_option("OUT", out, "Output dataset folder (created if missing)")->required();
  runtime::add_number(*segmentation, "--size", segmentation_options.size,
                      "Resize to SIZE x SIZE (shorter side, central crop; masks by the nearest pixel); 0: keep (all "
                      "one size)",
                      int64_t{0}, int64_t{1} << 16);
  runtime::add_number(*segmentation, "--channels", segmentation_options.channels, "1 or 3", int64_t{1}, int64_t{3});
  runtime::add_number(*segmentation, "--classes", segmentation_options.num_classes,
                      "Classes of the masks (0: the largest in the train masks + 1)", 0, 255);
  add_common_options(segmentation, common);

  SyntheticSegmentationSpec segmentation_spec;
  CLI::App* synthetic_segmentation = app.add_subcommand(
      "synthetic-segmentation",
      "Shapes over a background, one class each, with their masks (learnable) -> train, test (count/5)");
  synthetic_segmentation->add_option("OUT", out, "Output dataset folder (created if missing)")->required();
  runtime::add_number(*synthetic_segmentation, "--size", segmentation_spec.size, "Image side", int64_t{8},
                      int64_t{4096});
  runtime::add_number(*synthetic_segmentation, "--channels", segmentation_spec.channels, "1 or 3", int64_t{1},
                      int64_t{3});
  runtime::add_number(*synthetic_segmentation, "--count", segmentation_spec.count, "Train records", int64_t{1},
                      int64_t{1} << 40);
  runtime::add_number(*synthetic_segmentation, "--classes", segmentation_spec.num_classes,
                      "Classes, the background's (0) included", 2, 255);
  add_common_options(synthetic_segmentation, common);

  RT_PARSE_FLAGS(app, argc, argv);

  try {
    // The shards and manifest go beside the source's files, never among them (a source folder is read whole:
    // an imagefolder's classes, the idx files).
    io::RunFiles().reads_folder("SRC", src).writes_folder("OUT", out).check();
    ConvertOptions options;
    options.num_shards = common.shards;
    options.seed = common.seed;
    options.show_progress = !common.quiet;
    ConvertResult result;
    if (*fashion) result = convert_idx(src, out, "fashion-mnist", options);
    if (*mnist) result = convert_idx(src, out, "mnist", options);
    if (*cifar10) result = convert_cifar(src, out, 10, options);
    if (*cifar100) result = convert_cifar(src, out, 100, options);
    if (*imagefolder) {
      image_options.storage = keep_encoded || encode == "jpeg" ? ImageStorage::kJpeg : ImageStorage::kPixels;
      result = convert_imagefolder(src, out, image_options, options);
    }
    if (*segmentation) result = convert_segmentation_folder(src, out, segmentation_options, options);
    if (*synthetic_segmentation) result = convert_synthetic_segmentation(out, segmentation_spec, options);
    if (*synthetic) {
      spec.height = shape[0], spec.width = shape[1], spec.channels = shape[2];
      spec.storage = synthetic_encode == "jpeg" ? ImageStorage::kJpeg : ImageStorage::kPixels;
      result = convert_synthetic(out, spec, options);
    }
    print_summary(result, out);
    return 0;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "make_shards: error: out of host memory (an allocation failed)\n");
    std::fprintf(stderr, "make_shards: to use less memory: %s\n", kMemoryHint);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_shards: error: %s\n", io::explain_write_failure(out, e.what()).c_str());
    if (out_of_memory_message(e.what())) std::fprintf(stderr, "make_shards: to use less memory: %s\n", kMemoryHint);
    return 1;
  }
} catch (...) {
  return runtime::main_error("make_shards", kMemoryHint);  // no exception escapes main
}
