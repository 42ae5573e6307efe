// runtime/config/cli.h: the command-line flags every training app shares, bound to TrainerOptions, so an app
// gets the same flags, defaults, checks and messages as train_resnet with one call:
//   CLI::App app{"..."};
//   runtime::TrainerOptions options;  options.batch = 64;   // an app's own defaults, shown by --help
//   std::string data;
//   runtime::add_trainer_flags(app, options, data);
// A flag given twice takes the last value (wrappers put defaults first). Numbers are checked at parse
// time (range, and finite for every float flag: "nan" and "inf" are usage errors naming the flag).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/config/options.h"

namespace ringtrain::runtime {

// Adds --data and every training flag (length and batch, optimisation, device and precision, data
// parallelism, checkpoints, logs, trace, progress, --timeout, --check). Call before CLI11_PARSE; the app's
// own flags may follow. Parsing records every flag in options.flags (flag_values), which checkpoints keep.
void add_trainer_flags(CLI::App& app, TrainerOptions& options, std::string& data_dir);

// Every long option of `app` with its value as parsed ("on"/"off" for flags; given value, else the default),
// keyed as the configuration spells flags ("lr_step_epochs"). add_trainer_flags records it into
// TrainerOptions::flags when parsing completes.
nlohmann::json flag_values(const CLI::App& app);

// A CLI11 check that a number is finite (CLI::PositiveNumber and friends let NaN through).
const CLI::Validator& finite_number();

}  // namespace ringtrain::runtime
