// runtime/checkpoint/resume.cpp: choosing, loading and checking the checkpoint a run resumes from.
#include "runtime/checkpoint/resume.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <map>

#include "comm/host_collectives.h"
#include "core/check.h"
#include "core/parse.h"
#include "runtime/cluster/check_in.h"

namespace ringtrain::runtime {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Flags that change how a run is carried out but not what it computes: a resume may change them silently.
// Everything else — every other flag of the command line, the app's own included, and flags added later —
// is compared, and a change is said.
constexpr const char* kRuntimeOnly[] = {"data",
                                        "threads",
                                        "loader_threads",
                                        "loader_nice",
                                        "allow_shared_gpu",
                                        "gpus",
                                        "wait_for_gpu",
                                        "checkpoint_dir",
                                        "checkpoint_every",
                                        "checkpoint_every_min",
                                        "keep_last",
                                        "resume",
                                        "allow_batch_change",
                                        "start_over",
                                        "eval_every",
                                        "log_every",
                                        "progress",
                                        "log_jsonl",
                                        "trace",
                                        "trace_steps",
                                        "profile",
                                        "profile_steps",
                                        "profile_layers",
                                        "check",
                                        "timeout",
                                        "max_memory",
                                        "zero",
                                        "pipeline",
                                        "pipeline_stages",
                                        "pipeline_split",
                                        "pipeline_schedule",
                                        "pipeline_balance",
                                        "pipeline_recompute",
                                        "recompute",
                                        "cuda_graph",
                                        "strict"};
// What must be the same for a resume to continue the training at all.
constexpr const char* kIdentity[] = {"arch", "model", "optimizer", "dataset"};
// Flags added after checkpoints were written, with the value that is what a run did before the flag existed
// (its default): a side that lacks the key compares as that value, so an older checkpoint resumed with the
// default is no change, and with another value is said as one ("--tf32 on -> off").
struct Introduced {
  const char* key;
  const char* before;
};
constexpr Introduced kIntroducedLater[] = {{"tf32", "on"}};

bool listed(const std::string& key, const auto& list) {
  return std::find(std::begin(list), std::end(list), key) != std::end(list);
}

// Equal, or two spellings of one number ("0.1" and "1e-1").
bool same_value(const json& a, const json& b) {
  if (a == b) return true;
  if (!a.is_string() || !b.is_string()) return false;
  const std::optional<double> x = to_number<double>(a.get<std::string>()), y = to_number<double>(b.get<std::string>());
  return x && y && *x == *y;
}

std::string shown(const json& v) {
  if (v.is_null()) return "(none)";
  if (!v.is_string()) return v.dump();
  return v.get<std::string>().empty() ? std::string("\"\"") : v.get<std::string>();
}

std::string what_is(const std::string& key) {
  if (key == "dataset") return "the dataset";
  if (key == "model") return "the model";
  if (key == "arch") return "-a/--arch";
  return flag_of(key);
}

// `config`'s value of `key`: null when it has none, unless the key is a flag introduced later.
json value_of(const json& config, const std::string& key) {
  if (config.contains(key)) return config[key];
  for (const Introduced& i : kIntroducedLater)
    if (key == i.key) return i.before;
  return json();
}

// The keys of `a` and `b` that differ, except the runtime-only and identity ones, as "--flag old -> new".
std::string differences(const json& a, const json& b) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : a.items()) keys.push_back(k);
  for (const auto& [k, v] : b.items())
    if (!a.contains(k)) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  std::string out;
  for (const std::string& k : keys) {
    if (k == "flags" || listed(k, kRuntimeOnly) || listed(k, kIdentity)) continue;
    const json x = value_of(a, k), y = value_of(b, k);
    if (!same_value(x, y)) out += detail::str_cat(out.empty() ? "" : ", ", flag_of(k), " ", shown(x), " -> ", shown(y));
  }
  return out;
}

}  // namespace

ConfigComparison compare_config(const json& written, const json& now, const std::string& file) {
  ConfigComparison c;
  for (const char* key : kIdentity)
    if (written.contains(key) && now.contains(key) && !same_value(written[key], now[key])) {
      const std::string what = what_is(key);
      c.refusal = detail::str_cat("--resume ", file, ": the checkpoint was written with ", what, " ",
                                  written[key].dump(), " but this run has ", now[key].dump(),
                                  "; resuming would not continue that training (start a new run, or resume with the ",
                                  "same ", what, ")");
      return c;
    }
  // The command lines flag by flag when both runs recorded theirs (every flag, the app's own too), else the
  // typed configuration (a run configured in code, or a checkpoint written before flags were recorded).
  const bool both_flags = written.contains("flags") && now.contains("flags");
  c.changes = both_flags ? differences(written["flags"], now["flags"]) : differences(written, now);
  return c;
}

namespace {

// Rank 0's pick: --resume PATH, or the newest checkpoint of the folder that loads ("" when none). Temporary
// files of an interrupted write are removed first.
std::optional<CheckpointDir::Loaded> pick(const TrainerOptions& o, const CheckpointDir& ckpt, std::string& chosen) {
  for (const auto& name : ckpt.remove_stale_temp_files())
    std::fprintf(stderr, "%s: removed '%s' (left by an interrupted checkpoint write)\n", o.program.c_str(),
                 name.c_str());
  if (o.resume != "auto") {
    chosen = o.resume;
    return std::nullopt;
  }
  auto newest = ckpt.load_newest(
      [&](const std::string& w) { std::fprintf(stderr, "%s: warning: %s\n", o.program.c_str(), w.c_str()); });
  if (newest) chosen = newest->path.string();
  return newest;
}

}  // namespace

std::optional<Resumed> resume_point(const comm::World& world, const TrainerOptions& o, const CheckpointDir& ckpt,
                                    const RunPlan& plan, const std::string& dataset_signature) {
  if (o.resume.empty()) return std::nullopt;
  std::optional<CheckpointDir::Loaded> loaded;
  std::string chosen;
  if (world.is_root()) loaded = pick(o, ckpt, chosen);
  chosen = comm::broadcast(world.comm(), chosen, 0);
  if (chosen.empty()) return std::nullopt;
  std::string error;
  error = comm::failure_of([&] {
    RT_CHECK(fs::exists(chosen), "checkpoint '", chosen, "' does not exist here (every rank must be able to read the ",
             "checkpoint folder)");
    if (!loaded) loaded = CheckpointDir::load(chosen);
  });
  comm::agree_or_throw(world.comm(), error, "--resume", true);
  const TrainState& s = loaded->state;
  const bool batch_changed = s.global_batch != plan.global_batch;
  const std::string written_batch = detail::str_cat(s.global_batch, " (", s.world_size, " ranks x batch ",
                                                    s.config.value("batch_size", json(-1)).dump(), " x accum ",
                                                    s.config.value("accum_steps", json(-1)).dump(), ")");
  if (batch_changed && !o.allow_batch_change)
    RT_THROW_PERMANENT("--resume ", chosen, ": the checkpoint was written with global batch ", written_batch,
                       "; resume with the same global batch (now ", plan.global_batch,
                       "), or pass --allow-batch-change");
  if (batch_changed && world.is_root())
    std::fprintf(stderr,
                 "%s: warning: --allow-batch-change: resuming %s, written with global batch %s, at global "
                 "batch %lld: from here this is another training than the checkpoint's\n",
                 o.program.c_str(), chosen.c_str(), written_batch.c_str(), static_cast<long long>(plan.global_batch));
  json now = o.to_json();
  now["dataset"] = dataset_signature;
  const ConfigComparison c = compare_config(s.config, now, chosen);
  if (!c.refusal.empty()) throw PermanentError(c.refusal);
  if (!c.changes.empty() && world.is_root())
    std::fprintf(stderr,
                 "%s: warning: resuming %s with other flags than it was written with (%s): "
                 "from here this is not the checkpoint's training continued unchanged; the learning rate continues "
                 "from this run's schedule at step %lld\n",
                 o.program.c_str(), chosen.c_str(), c.changes.c_str(), static_cast<long long>(s.step));
  // -b auto under another budget: the same global batch in other micro-batches, which batch norm sees.
  const json written_micro = s.config.value("batch_size", json());
  if (!batch_changed && written_micro.is_number_integer() && written_micro.get<int64_t>() != plan.batch &&
      world.is_root())
    std::fprintf(stderr,
                 "%s: warning: resuming %s, written with micro-batches of %lld, in micro-batches of %lld (same "
                 "global batch): batch norm normalises over %lld images per rank from here\n",
                 o.program.c_str(), chosen.c_str(), static_cast<long long>(written_micro.get<int64_t>()),
                 static_cast<long long>(plan.batch), static_cast<long long>(plan.batch));
  if (s.step > plan.total_steps)
    RT_THROW_PERMANENT("--resume ", chosen, ": the checkpoint is at step ", s.step, ", past the end of this run (",
                       plan.total_steps, " steps): resume it with --steps ", s.step,
                       " or more (or more --epochs), or resume an earlier checkpoint");
  Resumed r;
  r.path = chosen;
  r.at.step = s.step;
  r.at.position = permanent_errors(
      [&] { return s.position_for(plan.per_step_global, plan.micro_per_epoch, chosen, batch_changed); });
  // A checkpoint's step and sampler position tell the same story at the same global batch: an epoch is
  // steps_per_epoch steps, a step accum sampler batches. (After an --allow-batch-change resume they need not.)
  const int64_t told = r.at.position.epoch * plan.steps_per_epoch + r.at.position.next_batch / plan.accum;
  if (!batch_changed && s.steps_follow_position && (told != s.step || r.at.position.next_batch % plan.accum != 0))
    RT_THROW_PERMANENT("--resume ", chosen, ": /meta/json says step ", s.step, " but its sampler position (epoch ",
                       s.position.epoch, ", batch ", s.position.next_batch, ") is step ", told, " of this run (",
                       plan.steps_per_epoch, " steps per epoch): the checkpoint's metadata is inconsistent (damaged ",
                       "or edited); resume another checkpoint");
  r.loaded = std::move(*loaded);
  r.batch_changed = batch_changed;
  return r;
}

namespace {

// The name of the first tensor of `tensors` holding a NaN or an infinity, or "".
std::string first_non_finite(const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    if (!is_floating(t.dtype())) continue;
    for (double v : t.to_vector())
      if (!std::isfinite(v)) return name;
  }
  return "";
}

// The name of the first tensor of `tensors` whose name ends in `suffix` holding a negative value, or "".
std::string first_negative(const NamedTensors& tensors, const std::string& suffix) {
  for (const auto& [name, t] : tensors) {
    if (!is_floating(t.dtype()) || !name.ends_with(suffix)) continue;
    for (double v : t.to_vector())
      if (v < 0) return name;
  }
  return "";
}

}  // namespace

void check_content(const Resumed& r, const std::vector<std::string>& params, const TrainerOptions& o) {
  const Checkpoint& c = r.loaded.checkpoint;
  const std::string what = c.checksummed ? "" : " (a file without a checksum, checked as strictly)";
  if (const std::string bad = first_non_finite(c.model); !bad.empty())
    RT_THROW_PERMANENT(
        "--resume ", r.path, ": /model/", bad, " holds NaN or infinite values", what,
        ": the run it was written by had diverged, or the file is damaged; resume an earlier checkpoint");
  if (const std::string bad = first_non_finite(c.optimizer); !bad.empty())
    RT_THROW_PERMANENT("--resume ", r.path, ": /optimizer/", bad, " holds NaN or infinite values", what,
                       "; resume an earlier checkpoint");
  // Variances are never negative: a BatchNorm's running variance (its square root normalizes every
  // evaluation), AdamW's second moment (its square root divides every update).
  if (const std::string bad = first_negative(c.model, "running_var"); !bad.empty())
    RT_THROW_PERMANENT("--resume ", r.path, ": /model/", bad, " holds negative values", what,
                       ": a variance is never negative, so the file is damaged or edited; resume another checkpoint");
  if (const std::string bad = first_negative(c.optimizer, "exp_avg_sq"); !bad.empty())
    RT_THROW_PERMANENT(
        "--resume ", r.path, ": /optimizer/", bad, " holds negative values", what,
        ": a second moment is never negative, so the file is damaged or edited; resume another checkpoint");
  std::map<std::string, const Tensor*> state;
  for (const auto& [name, t] : c.optimizer) state[name] = &t;
  const auto step = state.find("step");
  if (step == state.end()) RT_THROW_PERMANENT("--resume ", r.path, ": /optimizer has no 'step' entry", what);
  const auto taken = static_cast<int64_t>(step->second->item());
  if (taken < 0 || taken > r.at.step)
    RT_THROW_PERMANENT("--resume ", r.path, ": /optimizer/step is ", taken, " but the run took ", r.at.step, " step(s)",
                       what, ": the optimizer state is not this checkpoint's");
  if (taken == 0) return;
  // Past the first step every parameter has its state: SGD a momentum buffer (with momentum), AdamW both moments.
  std::vector<std::string> slots;
  if (o.optimizer == OptimizerKind::AdamW)
    slots = {".exp_avg", ".exp_avg_sq", ".step"};
  else if (o.momentum > 0)
    slots = {".momentum"};
  for (const std::string& p : params)
    for (const std::string& slot : slots)
      if (!state.contains(p + slot))
        RT_THROW_PERMANENT("--resume ", r.path, ": /optimizer has no '", p, slot, "' after ", taken, " step(s)", what,
                           ": the optimizer state is incomplete, and training on would restart it from nothing");
}

}  // namespace ringtrain::runtime
