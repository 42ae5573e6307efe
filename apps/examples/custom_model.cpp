// apps/examples/custom_model: your own CNN (not a ResNet) trained data-parallel on shard files by the
// runtime's Trainer, which brings exact resume, checkpoints, the watchdog, the JSONL log, the trace and
// exact evaluation across ranks with it. Every training flag of train_resnet works here too:
//   mpirun -np 2 ./custom_model --data DATA_DIR --epochs 2 -b 64 --checkpoint-dir ckpt --resume auto
// The running example of docs/LIBRARY.md; apps/examples/out_of_tree builds it against an installed ringtrain.
#include <CLI/CLI.hpp>

#include "comm/world.h"
#include "layers/basic.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/pooling.h"
#include "runtime/config/cli.h"
#include "runtime/config/data_source.h"
#include "runtime/loop/trainer.h"

using namespace ringtrain;

// conv-bn-relu, pool, conv-bn-relu, global average pool, (dropout,) linear. Modules registered in a
// Sequential get dotted names ("0.weight", "1.running_mean", ...) for state dicts and checkpoints.
std::shared_ptr<Sequential> make_net(int64_t channels, int64_t classes, double dropout) {
  auto conv = [](int64_t in, int64_t out) { return std::make_shared<Conv2d>(in, out, Conv2dOptions{.padding = 1}); };
  auto net = std::make_shared<Sequential>();
  net->add(conv(channels, 32)).add(std::make_shared<BatchNorm2d>(32)).add(std::make_shared<ReLU>());
  net->add(std::make_shared<MaxPool2d>(2, 2));
  net->add(conv(32, 64)).add(std::make_shared<BatchNorm2d>(64)).add(std::make_shared<ReLU>());
  net->add(std::make_shared<GlobalAvgPool>());
  if (dropout > 0) net->add(std::make_shared<Dropout>(dropout));
  net->add(std::make_shared<Linear>(64, classes));
  return net;
}

int main(int argc, char** argv) try {
  CLI::App app{"A custom CNN trained data-parallel on shard files (ringtrain's library example)"};
  runtime::TrainerOptions options;  // this app's defaults; --help shows them
  options.program = "custom_model";
  options.model_name = "custom-cnn";
  options.epochs = 2;
  options.batch = 64;
  std::string data_dir;
  double dropout = 0;
  runtime::add_trainer_flags(app, options, data_dir);
  runtime::add_number(app, "--dropout", dropout, "dropout before the classifier (0: none)", 0.0, 0.95);
  RT_PARSE_FLAGS(app, argc, argv);
  return comm::run_main(argc, argv, runtime::kTrainerMemoryHint, [&](comm::World& world) {
    RT_CHECK(!data_dir.empty(), "usage: custom_model --data DATA_DIR [flags] (--help lists them)");
    runtime::Trainer trainer(world, options);  // binds this rank, seeds the init, starts the watchdog
    auto data = runtime::open_shards(data_dir, {.train_transform = {.pad_crop = 2, .hflip = true},
                                                .seed = options.seed,
                                                .device = trainer.device(),
                                                .strict = options.strict});
    auto net = make_net(data->info().channels, data->info().classes, dropout);
    trainer.fit(*net, *data);  // SGD, cosine schedule, GradSync, checkpoints, evaluation, summary
    return 0;
  });
} catch (...) {
  return runtime::main_error("custom_model", runtime::kTrainerMemoryHint);  // no exception escapes main
}
