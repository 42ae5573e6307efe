// apps/model_app.h: what train_resnet and ringtrain_plan share: the flags about the model and its data (-a,
// --synthetic, --image-size, ...; beside the Trainer's own), and the run they prepare: the Trainer, the data
// (shards with the model's transforms, or synthetic data shaped for it) and the model.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/world.h"
#include "layers/module.h"
#include "runtime/config/data_source.h"
#include "runtime/config/options.h"
#include "runtime/loop/trainer.h"

namespace ringtrain::apps {

// The flags that are about the model and its data rather than about training.
struct ModelFlags {
  std::string arch = "resnet20";
  bool synthetic = false, hflip = true;
  int64_t synthetic_size = 2048, image_size = 0, pad_crop = -1;
};

// The Trainer's flags (runtime/config/cli.h) and the model's. A flag given twice takes the last value, so
// wrappers (scripts/demo.sh, the sbatch script) can put their defaults first and let the user's override them.
void add_model_flags(CLI::App& app, runtime::TrainerOptions& options, std::string& data_dir, ModelFlags& f);

// A run made ready: the Trainer (it binds the rank, seeds the model's initialisation, starts the watchdog and
// runs the preflight), the data and the model. Errors name the flag (--data and --synthetic, a model for
// another kind of data).
struct ModelRun {
  std::unique_ptr<runtime::Trainer> trainer;
  std::unique_ptr<runtime::DataSource> data;
  std::shared_ptr<Module> model;
};
ModelRun prepare_run(comm::World& world, runtime::TrainerOptions options, const std::string& data_dir,
                     const ModelFlags& f);

}  // namespace ringtrain::apps
