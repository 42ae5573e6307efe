// apps/train_resnet: data-parallel training of the library's CNNs, what users run:
//   mpirun -np 8 ./train_resnet --data /shards/cifar10 -a resnet56 -b 128 --epochs 90 --checkpoint-dir ckpt
// -a takes every model of layers/models/zoo.h: the ResNets, mobilenet_v2, efficientnet_b0..b7, convnext_tiny..large
// and, for segmentation data (per-pixel masks), unet and unet_gn. `--help` lists every flag with its default. The
// app is the model-specific part — the architecture, the image transforms, synthetic data shaped for the model —
// on top of the runtime's Trainer, which owns the loop and everything that makes a run trustworthy
// (runtime/loop/trainer.h): GradSync, exact resume, checkpoints, evaluation, the watchdog (--timeout), the
// check-in, the JSONL log and the merged trace.
// An error on any rank prints "rank R (host): reason" once and ends the whole job (comm::run_main).
// ringtrain_plan (apps/ringtrain_plan.cpp) takes the same flags and prints what --layout auto would choose.
#include <CLI/CLI.hpp>
#include <string>

#include "apps/model_app.h"
#include "comm/world.h"
#include "runtime/config/cli.h"

using namespace ringtrain;

int main(int argc, char** argv) try {
  CLI::App app{
      "Data-parallel training of ResNets, MobileNetV2, EfficientNet, ConvNeXt and UNets (run under mpirun for several "
      "ranks)"};
  runtime::TrainerOptions options;
  options.program = "train_resnet";
  std::string data_dir;
  apps::ModelFlags f;
  apps::add_model_flags(app, options, data_dir, f);
  RT_PARSE_FLAGS(app, argc, argv);
  return comm::run_main(argc, argv, runtime::kTrainerMemoryHint, [&](comm::World& world) {
    apps::ModelRun run = apps::prepare_run(world, options, data_dir, f);
    run.trainer->fit(*run.model, *run.data);
    return 0;
  });
} catch (...) {
  return runtime::main_error("train_resnet", runtime::kTrainerMemoryHint);  // no exception escapes main
}
