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
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/parse.h"
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

// How --help shows a number flag's type: "INT in [0, 4096]", "FLOAT in (0, 1e+06]", "INT,... in [0, 1024]".
// tests/apps/flag_sweep.sh reads these to feed every number flag of every program its boundaries.
template <typename T>
std::string number_type_name(const NumberRange<T>& range, bool list = false) {
  std::string text = range.text();  // "an integer in [0, 4096]"
  text = text.substr(text.find(" in "));
  return std::string(std::is_integral_v<T> ? "INT" : "FLOAT") + (list ? ",..." : "") + text;
}

// A number flag bound to `target`. CLI11's own conversion wraps "-1" into an unsigned, saturates at
// 2^64, and reads "010" as octal; this one takes the whole value as one decimal T inside `range`
// (core/parse.h), or the parse fails naming the flag and the range. --help shows the range, and the
// default: target's value when the flag is added.
template <typename T>
CLI::Option* add_number(CLI::App& app, const std::string& names, T& target, const std::string& help,
                        const NumberRange<T>& range) {
  return app
      .add_option_function<std::string>(
          names, [&target](const std::string& v) { target = *to_number<T>(v); }, help)
      ->type_name(number_type_name(range))
      ->default_str(number_text(target))
      ->check(CLI::Validator([range](std::string& v) { return number_problem<T>(v, range); }, ""));
}
template <typename T>
CLI::Option* add_number(CLI::App& app, const std::string& names, T& target, const std::string& help,
                        std::type_identity_t<T> lo, std::type_identity_t<T> hi) {
  return add_number(app, names, target, help, NumberRange<T>{lo, hi});
}
// A float flag in (0, hi].
template <typename T>
CLI::Option* add_positive(CLI::App& app, const std::string& names, T& target, const std::string& help,
                          std::type_identity_t<T> hi) {
  return add_number(app, names, target, help, NumberRange<T>{T{0}, hi, true});
}

// A byte count flag (core/parse.h's parse_bytes: 512M, 8G, 300MB) of at least `min` bytes. --help shows
// its type as SIZE.
CLI::Option* add_bytes(CLI::App& app, const std::string& names, int64_t& target, const std::string& help,
                       int64_t min = 1);

// A comma-separated list of numbers ("0,9,18"), each a T inside `range`, kept as the text given (options
// record flags as text); read it with parse_number_list<T>, which applies the same rule.
template <typename T>
CLI::Option* add_number_list(CLI::App& app, const std::string& names, std::string& text, const std::string& help,
                             const NumberRange<T>& range) {
  return app.add_option(names, text, help)
      ->type_name(number_type_name(range, true))
      ->check(CLI::Validator([range](std::string& v) { return number_list_problem<T>(v, range); }, ""));
}

// Parses the command line into `app`. nullopt: go on; else main's exit code (0 after --help, 2 or
// CLI11's code for a usage error), the message printed. A ringtrain::Error thrown by a flag's own
// callback while parsing is a usage error too, printed as "<program>: <message>". The environment's
// RINGTRAIN_* variables are checked first (core/env.h check_environment), --help or not: a bad value is
// "<program>: error: ..." and exit 2; a name no program reads is a warning. Use RT_PARSE_FLAGS.
std::optional<int> parse_flags(CLI::App& app, int argc, const char* const* argv);

// Every program's main is a function-try-block ending in this, so no exception escapes main:
//   int main(int argc, char** argv) try { ... } catch (...) { return runtime::main_error("train_resnet"); }
// It prints "<program>: error: <message>" (bad_alloc as "out of host memory") and returns 1. An error that
// ran out of memory (the allocators' messages state the facts only) is followed by `memory_hint`, what this
// program's own flags can do about it ("<program>: to use less memory: <hint>"); nullptr: nothing.
// tests/apps/flag_sweep.sh checks that every program's main has it.
int main_error(const char* program, const char* memory_hint = nullptr) noexcept;
// What the Trainer's flags can do about memory, for every Trainer app's main_error.
extern const char* const kTrainerMemoryHint;

}  // namespace ringtrain::runtime

// In a main: parse, or return the usage error's exit code.
#define RT_PARSE_FLAGS(app, argc, argv) \
  if (const std::optional<int> rt_parse_rc = ::ringtrain::runtime::parse_flags(app, argc, argv)) return *rt_parse_rc
