// apps/model_app.cpp: the model and data flags of train_resnet and ringtrain_plan, and the run they prepare.
#include "apps/model_app.h"

#include <algorithm>

#include "core/check.h"
#include "data/loader.h"
#include "layers/models/zoo.h"
#include "runtime/config/cli.h"

namespace ringtrain::apps {
namespace {

// The side a model takes nearest to `side` from above: at least its smallest (ConvNeXt: 32), a multiple of it
// where it must be (a UNet of depth 3: 8).
int64_t side_for(const ModelInfo& m, int64_t side) {
  side = std::max(side, m.min_side);
  return m.multiple_of_min ? (side + m.min_side - 1) / m.min_side * m.min_side : side;
}

// CIFAR-sized images (up to 64 px) get random crops with 4-pixel padding, resized first where --image-size asks
// or the model needs another side (Fashion-MNIST's 28x28 to ConvNeXt's 32x32); larger ones random-resized crops
// to --image-size (default 224). Both flip horizontally unless --no-hflip.
data::Transform transform_for(const data::SplitInfo& split, const ModelFlags& f) {
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
                                               const ModelFlags& f) {
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

}  // namespace

void add_model_flags(CLI::App& app, runtime::TrainerOptions& options, std::string& data_dir, ModelFlags& f) {
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
}

ModelRun prepare_run(comm::World& world, runtime::TrainerOptions options, const std::string& data_dir,
                     const ModelFlags& f) {
  RT_CHECK(f.synthetic != !data_dir.empty(), "give exactly one of --data DIR or --synthetic");
  options.model_name = f.arch;
  options.app_config = {{"data", data_dir},
                        {"synthetic", f.synthetic},
                        {"arch", f.arch},
                        {"pad_crop", f.pad_crop},
                        {"hflip", f.hflip},
                        {"image_size", f.image_size},
                        {"synthetic_size", f.synthetic_size}};
  ModelRun run;
  run.trainer = std::make_unique<runtime::Trainer>(world, options);
  run.data = open_data(*run.trainer, data_dir, f);
  run.model = make_model(f.arch, {.in_channels = run.data->info().channels, .num_classes = run.data->info().classes});
  return run;
}

}  // namespace ringtrain::apps
