// apps/train_resnet: data-parallel training of the library's CNNs, what users run:
//   mpirun -np 8 ./train_resnet --data /shards/cifar10 -a resnet56 -b 128 --epochs 90 --checkpoint-dir ckpt
// -a takes every model of layers/models/zoo.h: the ResNets, mobilenet_v2, efficientnet_b0..b7, convnext_tiny..large
// and, for segmentation data (per-pixel masks), unet and unet_gn. `--help` lists every flag with its default. The
// app is the model-specific part — the architecture, the image transforms, synthetic data shaped for the model —
// on top of the runtime's Trainer, which owns the loop and everything that makes a run trustworthy
// (runtime/loop/trainer.h): GradSync, exact resume, checkpoints, evaluation, the watchdog (--timeout), the
// check-in, the JSONL log and the merged trace.
// An error on any rank prints "rank R (host): reason" once and ends the whole job (comm::run_main).
//
// Built a second time as ringtrain_plan (RINGTRAIN_PLAN_ONLY): the same flags, and what --layout auto would
// choose, printed without training; with --hosts, --ranks-per-host, --link and --device-memory it answers for a
// world it does not run in (runtime/layout/layout_probe.h):
//   ./ringtrain_plan --synthetic -a resnet50 --image-size 64 --global-batch 1024 --hosts 64 --ranks-per-host 8
//       --link 100Gbit --device-memory 80G --scaling
#include <CLI/CLI.hpp>
#include <algorithm>
#include <string>

#include "comm/world.h"
#include "core/check.h"
#include "data/loader.h"
#include "layers/models/zoo.h"
#include "runtime/config/cli.h"
#include "runtime/config/data_source.h"
#include "runtime/loop/trainer.h"

using namespace ringtrain;

namespace {

// The flags that are about ResNets and their data rather than about training.
struct ResNetFlags {
  std::string arch = "resnet20";
  bool synthetic = false, hflip = true;
  int64_t synthetic_size = 2048, image_size = 0, pad_crop = -1;
#ifdef RINGTRAIN_PLAN_ONLY
  runtime::LayoutWhatIf what_if;
#endif
};

// The side a model takes nearest to `side` from above: at least its smallest (ConvNeXt: 32), a multiple of it
// where it must be (a UNet of depth 3: 8).
int64_t side_for(const ModelInfo& m, int64_t side) {
  side = std::max(side, m.min_side);
  return m.multiple_of_min ? (side + m.min_side - 1) / m.min_side * m.min_side : side;
}

// CIFAR-sized images (up to 64 px) get random crops with 4-pixel padding, resized first where --image-size asks
// or the model needs another side (Fashion-MNIST's 28x28 to ConvNeXt's 32x32); larger ones random-resized crops
// to --image-size (default 224). Both flip horizontally unless --no-hflip.
data::Transform transform_for(const data::SplitInfo& split, const ResNetFlags& f) {
  const ModelInfo& m = model_info(f.arch);
  const bool small = !split.varied_size() && split.height <= 64;
  data::Transform t;
  t.train = true;
  t.hflip = f.hflip;
  if (small) {
    const int64_t side = side_for(m, f.image_size > 0 ? f.image_size : std::max(split.height, split.width));
    if (side != split.height || side != split.width) t.resize = side;
  } else {
    t.resized_crop = side_for(m, f.image_size > 0 ? f.image_size : 224);
  }
  const int64_t out = t.resize > 0 ? t.resize : std::min(split.height, split.width);
  t.pad_crop = f.pad_crop >= 0 ? f.pad_crop : (small ? 4 : 0);
  RT_CHECK(t.pad_crop == 0 || t.pad_crop <= out, "--pad-crop ", t.pad_crop, " is larger than the ", split.shape_text(),
           " images of the dataset", t.resize > 0 ? detail::str_cat(" (resized to ", t.resize, ")") : std::string());
  return t;
}

std::unique_ptr<runtime::DataSource> open_data(const runtime::Trainer& trainer, const std::string& dir,
                                               const ResNetFlags& f) {
  const runtime::TrainerOptions& o = trainer.options();
  const ModelInfo& m = model_info(f.arch);
  std::unique_ptr<runtime::DataSource> data;
  if (!f.synthetic) {
    data =
        runtime::open_shards(dir, {.choose_transform = [&f](const data::SplitInfo& s) { return transform_for(s, f); },
                                   .loader_threads = o.loader_threads,
                                   .loader_nice = o.loader_nice,
                                   .seed = o.seed,
                                   .device = trainer.device(),
                                   .strict = o.strict});
    if (data->info().segmentation != m.segmentation)
      RT_THROW_PERMANENT("-a ", f.arch, m.segmentation ? " predicts a class per pixel" : " predicts a class per image",
                         ": --data '", dir, "' holds ",
                         data->info().segmentation ? "per-pixel masks" : "a label per image",
                         m.segmentation ? " (a UNet trains on segmentation shards: make_shards segmentation or "
                                          "synthetic-segmentation)"
                                        : " (choose -a unet or unet_gn for it)");
    return data;
  }
  const int64_t side = side_for(m, f.image_size > 0 ? f.image_size : m.default_side);
  const bool cifar = m.default_side == 32;
  return runtime::synthetic_data({.size = f.synthetic_size,
                                  .height = side,
                                  .width = side,
                                  .channels = 3,
                                  .classes = m.segmentation ? 4 : (cifar ? 10 : 1000),
                                  .seed = o.seed,
                                  .device = trainer.device(),
                                  .segmentation = m.segmentation});
}

int train(comm::World& world, runtime::TrainerOptions options, const std::string& data_dir, const ResNetFlags& f) {
  RT_CHECK(f.synthetic != !data_dir.empty(), "give exactly one of --data DIR or --synthetic");
  options.model_name = f.arch;
  options.app_config = {{"data", data_dir},
                        {"synthetic", f.synthetic},
                        {"arch", f.arch},
                        {"pad_crop", f.pad_crop},
                        {"hflip", f.hflip},
                        {"image_size", f.image_size},
                        {"synthetic_size", f.synthetic_size}};
  runtime::Trainer trainer(world, options);  // binds the rank, seeds init, watchdog, preflight (--check)
  auto data = open_data(trainer, data_dir, f);
  const std::shared_ptr<Module> model =
      make_model(f.arch, {.in_channels = data->info().channels, .num_classes = data->info().classes});
#ifdef RINGTRAIN_PLAN_ONLY
  trainer.plan_layout(*model, *data, f.what_if);
#else
  trainer.fit(*model, *data);
#endif
  return 0;
}

#ifdef RINGTRAIN_PLAN_ONLY
// ringtrain_plan's own flags: the world to plan for, where it is not the one it runs in.
void add_what_if_flags(CLI::App& app, runtime::LayoutWhatIf& w) {
  runtime::add_number(app, "--hosts", w.hosts, "plan for this many hosts (0: the hosts it runs on)", 0, 1 << 20);
  runtime::add_number(app, "--ranks-per-host", w.ranks_per_host,
                      "plan for this many ranks on each host (0: as many as it runs with)", 0, 1 << 16);
  app.add_option_function<std::string>(
      "--link", [&w](const std::string& v) { w.link_rate = runtime::parse_link_rate(v, "--link"); },
      "the link between hosts: 100Gbit, 25Gbps, 10GB/s (default: measured between the hosts it runs on, else "
      "--link-calibration's)");
  app.add_option_function<std::string>(
      "--link-latency", [&w](const std::string& v) { w.link_latency = runtime::parse_latency(v, "--link-latency"); },
      "the latency between hosts a message pays: 20us, 0.1ms (default: measured, else the calibration's)");
  app.add_option_function<std::string>(
      "--intra-link", [&w](const std::string& v) { w.intra_rate = runtime::parse_link_rate(v, "--intra-link"); },
      "the link between the ranks of one host (NVLink: 400GB/s; default: measured)");
  app.add_option_function<std::string>(
      "--intra-latency", [&w](const std::string& v) { w.intra_latency = runtime::parse_latency(v, "--intra-latency"); },
      "the latency between the ranks of one host (default: measured)");
  runtime::add_bytes(app, "--device-memory", w.device_memory,
                     "each rank's memory budget (80G; default: --max-memory, else this machine's)", 1);
  app.add_option("--save-link", w.save_link,
                 "write the link measured between the ranks it runs on here, for --link-calibration");
  app.add_flag("--scaling", w.scaling,
               "also the best layout on 1, 2, 4, ... hosts up to --hosts, as many images a rank (weak scaling): "
               "speed-up, efficiency, communication share, from the same measurements");
}
#endif

}  // namespace

#ifdef RINGTRAIN_PLAN_ONLY
constexpr const char* program = "ringtrain_plan";
#else
constexpr const char* program = "train_resnet";
#endif

int main(int argc, char** argv) try {
#ifdef RINGTRAIN_PLAN_ONLY
  CLI::App app{
      "The layout --layout auto would choose for train_resnet's flags, printed without training; "
      "--hosts, --ranks-per-host, --link and --device-memory ask about a world it does not run in"};
#else
  CLI::App app{
      "Data-parallel training of ResNets, MobileNetV2, EfficientNet, ConvNeXt and UNets (run under mpirun for several "
      "ranks)"};
#endif
  runtime::TrainerOptions options;
  options.program = program;
  std::string data_dir;
  ResNetFlags f;
  // A flag given twice takes the last value, so wrappers (scripts/demo.sh, the sbatch script) can put
  // their defaults first and let the user's flags override them.
  runtime::add_trainer_flags(app, options, data_dir);
  app.add_flag("--synthetic", f.synthetic, "random data shaped for the model instead of --data");
  runtime::add_number(app, "--synthetic-size", f.synthetic_size, "records per synthetic epoch", 1, int64_t{1} << 40);
  app.add_option("-a,--arch", f.arch,
                 "resnet20|32|44|56|110 (CIFAR), resnet18|34|50|101|152, mobilenet_v2, efficientnet_b0..b7, "
                 "convnext_tiny|small|base|large; unet, unet_gn (segmentation data)")
      ->capture_default_str()
      ->check(CLI::IsMember(model_names()));
  runtime::add_number(app, "--pad-crop", f.pad_crop, "random crop padding (-1: 4 for images up to 64 px, else off)", -1,
                      int64_t{1} << 16);
  runtime::add_number(app, "--image-size", f.image_size,
                      "random-resized-crop size for large images, resize for small ones, synthetic size (0: model "
                      "default; raised to what the model takes)",
                      0, int64_t{1} << 16);
  app.add_flag("!--no-hflip", f.hflip, "disable random horizontal flips");
#ifdef RINGTRAIN_PLAN_ONLY
  add_what_if_flags(app, f.what_if);
  RT_PARSE_FLAGS(app, argc, argv);
  RT_CHECK(app.count("--layout") == 0 || options.layout_auto, "ringtrain_plan plans the layout: --layout given does ",
           "not apply to it");
  options.layout_auto = true;
  if (!f.what_if.save_link.empty()) options.written_files.emplace_back("--save-link", f.what_if.save_link);
#else
  RT_PARSE_FLAGS(app, argc, argv);
#endif
  return comm::run_main(argc, argv, runtime::kTrainerMemoryHint,
                        [&](comm::World& world) { return train(world, options, data_dir, f); });
} catch (...) {
  return runtime::main_error(program, runtime::kTrainerMemoryHint);  // no exception escapes main
}
