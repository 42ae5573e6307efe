// core/env.cpp: see env.h.
#include "core/env.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "core/check.h"
#include "core/cpu_features.h"
#include "core/ops.h"
#include "core/parallel.h"

namespace ringtrain {

std::optional<std::string> env_text(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

bool env_switch(const char* name, bool fallback, const char* meaning) {
  const std::optional<std::string> v = env_text(name);
  if (!v) return fallback;
  if (*v == "1") return true;
  if (*v == "0") return false;
  RT_THROW_PERMANENT(name, "='", *v, "': expected 1 (", meaning, ") or 0 (off), or leave it unset (",
                     fallback ? "on" : "off", ")");
}

template <typename T>
std::optional<T> env_number(const char* name, const NumberRange<T>& range) {
  const std::optional<std::string> v = env_text(name);
  if (!v) return std::nullopt;
  return parse_number<T>(name, *v, range);
}

namespace {

constexpr int64_t kMaxRestart = 1000000000;

enum class Kind { Switch, Number, Choice, Text };
struct Variable {
  const char* name;
  Kind kind;
  const char* meaning = "";  // a switch: what 1 does
  int64_t lo = 0, hi = 0;    // a number's range
  void (*read)() = nullptr;  // a choice: its reader, which refuses a name it lacks (or this CPU lacks)
  bool on = false;           // a switch: its value when unset
};

// docs/ENVIRONMENT.md, by kind (tests/apps/env_rule.sh keeps the two and the sources in step).
constexpr Variable kVariables[] = {
    {"RINGTRAIN_THREADS", Kind::Number, "", 0, kMaxThreads},
    {"RINGTRAIN_CPU_CONV", Kind::Choice, "", 0, 0, [] { cpu_convolution(); }},
    {"RINGTRAIN_CPU_BF16", Kind::Choice, "", 0, 0, [] { cpu_bf16_kernels(); }},
    {"RINGTRAIN_MALLOC_DEFAULTS", Kind::Switch, "leave glibc's malloc thresholds as they are"},
    {"RINGTRAIN_CUDNN_BENCHMARK", Kind::Switch, "time cuDNN's algorithms and keep the fastest", 0, 0, nullptr, true},
    {"RINGTRAIN_CUDNN_DETERMINISTIC", Kind::Switch, "deterministic cuDNN algorithms only"},
    {"RINGTRAIN_CUDNN_WORKSPACE_MB", Kind::Number, "", 0, int64_t{1} << 24},
    {"RINGTRAIN_CUDA_SYNC", Kind::Switch, "synchronize after every CUDA op"},
    {"RINGTRAIN_GPU_LOCK_DIR", Kind::Text},
    {"RINGTRAIN_NVML_LIBRARY", Kind::Text},
    {"RINGTRAIN_DEBUG_PHASES", Kind::Switch, "print every phase the watchdog is told"},
    {"RINGTRAIN_SUPERVISOR", Kind::Text},
    {"RINGTRAIN_RESTART", Kind::Number, "", 0, kMaxRestart},
    {"RINGTRAIN_INJECT", Kind::Text},  // its own parser (runtime/cluster/fault_injection.h) checks it at the start
    {"RINGTRAIN_CUDA_GRAPH_EMULATE", Kind::Switch, "emulate CUDA graphs on the CPU, for tests"},
    {"RINGTRAIN_FAKE_BUILD", Kind::Text},
    {"RINGTRAIN_COMMIT", Kind::Text},        // scripts/gpu_check.sh
    {"RINGTRAIN_MACHINE_ROOT", Kind::Text},  // scripts/gpu_prefix.sh
};

const Variable& variable(const char* name, Kind kind) {
  for (const Variable& v : kVariables)
    if (std::string_view(v.name) == name) {
      RT_CHECK(v.kind == kind, name, " is not read as core/env.cpp's table lists it");
      return v;
    }
  RT_THROW(name, " is missing from core/env.cpp's table of the variables ringtrain reads");
}

}  // namespace

bool ringtrain_switch(const char* name) {
  const Variable& v = variable(name, Kind::Switch);
  return env_switch(v.name, v.on, v.meaning);
}

std::optional<int64_t> ringtrain_number(const char* name) {
  const Variable& v = variable(name, Kind::Number);
  return env_number<int64_t>(v.name, {v.lo, v.hi});
}

std::vector<std::string> check_environment() {
  for (const Variable& v : kVariables) {
    const std::optional<std::string> text = env_text(v.name);
    if (!text) continue;
    if (v.kind == Kind::Switch) ringtrain_switch(v.name);
    if (v.kind == Kind::Number) ringtrain_number(v.name);
    if (v.kind == Kind::Choice) v.read();
  }
  std::vector<std::string> warnings;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    if (entry.rfind("RINGTRAIN_", 0) != 0) continue;
    const std::string name = entry.substr(0, entry.find('='));
    bool known = false;
    for (const Variable& v : kVariables) known = known || name == v.name;
    if (!known)
      warnings.push_back(detail::str_cat(name, " is set, but no ringtrain program reads it (docs/ENVIRONMENT.md lists ",
                                         "those that are read): a misspelt name?"));
  }
  return warnings;
}

int64_t restart_count() { return ringtrain_number("RINGTRAIN_RESTART").value_or(0); }

template std::optional<int> env_number<int>(const char*, const NumberRange<int>&);
template std::optional<int64_t> env_number<int64_t>(const char*, const NumberRange<int64_t>&);
template std::optional<double> env_number<double>(const char*, const NumberRange<double>&);

}  // namespace ringtrain
