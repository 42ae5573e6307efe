// apps/examples/small_unet: a small UNet written from the library's public pieces -- convolutions, GroupNorm,
// SiLU, max pooling, bilinear upsampling and the concatenation of skip connections -- trained data-parallel on
// segmentation shards (per-pixel masks) by the runtime's Trainer, which scores it by pixel accuracy and mean IoU:
//   make_shards synthetic-segmentation seg --size 32 --count 512
//   mpirun -np 2 ./small_unet --data seg --epochs 10 -b 16
// Every training flag of train_resnet works here too. The walk-through of docs/LIBRARY.md section 10.
#include <CLI/CLI.hpp>

#include "comm/world.h"
#include "core/ops.h"
#include "layers/activation.h"
#include "layers/basic.h"
#include "layers/conv2d.h"
#include "layers/norm.h"
#include "layers/pooling.h"
#include "runtime/config/cli.h"
#include "runtime/config/data_source.h"
#include "runtime/loop/trainer.h"

using namespace ringtrain;

// (3x3 convolution -> GroupNorm -> SiLU) twice. GroupNorm normalises each image on its own, so it does not care
// how small a rank's batch is (batch norm would).
std::shared_ptr<Sequential> conv_block(int64_t in, int64_t out, int64_t groups) {
  auto block = std::make_shared<Sequential>();
  for (int64_t from : {in, out}) {
    block->add(std::make_shared<Conv2d>(from, out, Conv2dOptions{.padding = 1}));
    block->add(std::make_shared<GroupNorm>(groups, out)).add(std::make_shared<SiLU>());
  }
  return block;
}

// Two levels down, two up. Images (N, H, W, C) with H and W multiples of 4; logits (N, H, W, classes).
class SmallUNet : public Module {
 public:
  SmallUNet(int64_t in, int64_t classes, int64_t width, int64_t groups) {
    enc1_ = register_module("enc1", conv_block(in, width, groups));
    enc2_ = register_module("enc2", conv_block(width, 2 * width, groups));
    mid_ = register_module("mid", conv_block(2 * width, 4 * width, groups));
    dec2_ = register_module("dec2", conv_block(4 * width + 2 * width, 2 * width, groups));  // upsampled + skip
    dec1_ = register_module("dec1", conv_block(2 * width + width, width, groups));
    head_ = register_module(
        "head",
        std::make_shared<Conv2d>(width, classes, Conv2dOptions{.kernel_h = 1, .kernel_w = 1, .bias = Bias::With}));
  }

  Tensor forward(const Tensor& x) override {
    const Tensor e1 = enc1_->forward(x);          // (N, H, W, w)
    const Tensor e2 = enc2_->forward(pool_(e1));  // (N, H/2, W/2, 2w)
    const Tensor m = mid_->forward(pool_(e2));    // (N, H/4, W/4, 4w)
    const int channels = 3;                       // NHWC: the skip joins along the channels
    const Tensor d2 = dec2_->forward(cat({up(m), e2}, channels));
    const Tensor d1 = dec1_->forward(cat({up(d2), e1}, channels));
    return head_->forward(d1);
  }
  std::string type_name() const override { return "SmallUNet"; }

 private:
  // Twice the size, bilinear (PyTorch's nn.Upsample(scale_factor=2, mode="bilinear")).
  static Tensor up(const Tensor& x) {
    return upsample(x, {.scale_h = 2, .scale_w = 2, .mode = UpsampleMode::Bilinear});
  }

  std::shared_ptr<Sequential> enc1_, enc2_, mid_, dec2_, dec1_;
  std::shared_ptr<Conv2d> head_;
  MaxPool2d pool_{2, 2};
};

int main(int argc, char** argv) try {
  CLI::App app{"A small UNet trained data-parallel on segmentation shards (ringtrain's library example)"};
  runtime::TrainerOptions options;
  options.program = "small_unet";
  options.model_name = "small-unet";
  options.epochs = 10;
  options.batch = 16;
  std::string data_dir;
  int64_t width = 16;
  runtime::add_trainer_flags(app, options, data_dir);
  runtime::add_number(app, "--width", width, "the first level's channels (a multiple of 4)", int64_t{4}, int64_t{1024});
  RT_PARSE_FLAGS(app, argc, argv);
  return comm::run_main(argc, argv, runtime::kTrainerMemoryHint, [&](comm::World& world) {
    RT_CHECK(!data_dir.empty(), "usage: small_unet --data DATA_DIR [flags] (--help lists them)");
    RT_CHECK(width % 4 == 0, "--width ", width, ": GroupNorm's 4 groups must divide it");
    runtime::Trainer trainer(world, options);
    // Random crops and flips: each mask follows its image (the loader draws them once for both).
    auto data = runtime::open_shards(data_dir, {.train_transform = {.pad_crop = 2, .hflip = true},
                                                .seed = options.seed,
                                                .device = trainer.device(),
                                                .strict = options.strict});
    const runtime::DataInfo& info = data->info();
    RT_CHECK(info.segmentation, "--data '", data_dir,
             "' holds a label per image: small_unet needs per-pixel masks (make_shards segmentation or "
             "synthetic-segmentation)");
    RT_CHECK(info.height % 4 == 0 && info.width % 4 == 0, "--data '", data_dir, "' holds ", info.height, "x",
             info.width, " images: small_unet pools twice, so both sides must be multiples of 4");
    SmallUNet net(info.channels, info.classes, width, 4);
    trainer.fit(net, *data);  // the loss skips ignored pixels; evaluation reports pixel accuracy and mean IoU
    return 0;
  });
} catch (...) {
  return runtime::main_error("small_unet", runtime::kTrainerMemoryHint);
}
