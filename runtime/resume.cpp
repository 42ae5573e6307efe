// runtime/resume.cpp: choosing, loading and checking the checkpoint a run resumes from.
#include "runtime/resume.h"

#include <cstdio>
#include <filesystem>

#include "comm/host_collectives.h"
#include "core/check.h"
#include "runtime/check_in.h"

namespace ringtrain::runtime {

using json = nlohmann::json;
namespace fs = std::filesystem;

ConfigComparison compare_config(const json& written, const json& now, const std::string& file) {
  auto differs = [&](const char* key) {
    return written.contains(key) && now.contains(key) && written[key] != now[key];
  };
  ConfigComparison c;
  for (const char* key : {"arch", "model", "optimizer", "dataset"})
    if (differs(key)) {
      const std::string what = std::string(key) == "dataset" ? "the dataset" : flag_of(key);
      c.refusal = detail::str_cat("--resume ", file, ": the checkpoint was written with ", what, " ",
                                  written[key].dump(), " but this run has ", now[key].dump(),
                                  "; resuming would not continue that training (start a new run, or resume with the ",
                                  "same ", what, ")");
      return c;
    }
  for (const char* key : {"steps", "epochs", "lr", "lr_schedule", "warmup_epochs", "lr_step_epochs", "lr_milestones",
                          "lr_gamma", "lr_scaling", "momentum", "wd", "label_smoothing", "precision", "clip_grad_norm"})
    if (differs(key))
      c.changes += detail::str_cat(c.changes.empty() ? "" : ", ", flag_of(key), " ", written[key].dump(), " -> ",
                                   now[key].dump());
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
  try {
    RT_CHECK(fs::exists(chosen), "checkpoint '", chosen, "' does not exist here (every rank must be able to read the ",
             "checkpoint folder)");
    if (!loaded) loaded = CheckpointDir::load(chosen);
  } catch (const std::exception& e) {
    error = e.what();
  }
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
                 "%s: warning: resuming %s with another run length or schedule than it was written with (%s): "
                 "the learning rate continues from this run's schedule at step %lld\n",
                 o.program.c_str(), chosen.c_str(), c.changes.c_str(), static_cast<long long>(s.step));
  Resumed r;
  r.path = chosen;
  r.at.step = s.step;
  r.at.position = permanent_errors(
      [&] { return s.position_for(plan.per_step_global, plan.micro_per_epoch, chosen, batch_changed); });
  r.loaded = std::move(*loaded);
  return r;
}

}  // namespace ringtrain::runtime
