// runtime/checkpoint/resume.h: where a run starts. With --resume, rank 0 picks the checkpoint (--resume auto: the
// newest of --checkpoint-dir that loads, warning about each it skips; else the path given), every rank loads it, and it
// is checked against this run: the global batch (another is refused unless --allow-batch-change), the flags that decide
// what is trained (refused when they differ) and those of the run's length and schedule (said when they differ); the
// sampler position is converted to this run's batches (another world size at the same global batch continues at the
// same sample). The model, optimizer and loss scale are loaded by the Trainer from what this returns.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/world.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/config/options.h"
#include "runtime/config/plan.h"

namespace ringtrain::runtime {

struct Resumed {
  std::string path;
  CheckpointDir::Loaded loaded;  // the model, the optimizer state and the TrainState
  Cursor at;                     // the checkpoint's step and position, in this run's sampler batches
  bool batch_changed = false;    // written at another global batch (--allow-batch-change)
};

// Collective. nullopt when the run starts afresh (no --resume, or --resume auto on a folder without a
// checkpoint). Errors about the checkpoint against this run are PermanentErrors naming the file: another
// global batch (unless allowed), model, optimizer or dataset; a step past this run's end; a step that its
// own sampler position contradicts.

std::optional<Resumed> resume_point(const comm::World& world, const TrainerOptions& o, const CheckpointDir& ckpt,
                                    const RunPlan& plan, const std::string& dataset_signature);

// A checkpoint's flags (its /meta "config") against this run's. `refusal` is set when resuming would not
// continue that training (another model, optimizer or dataset); `changes` lists the flags of the run's
// length and schedule that differ, as "--lr 0.1 -> 0.2, ...". A flag added since a checkpoint was written
// (--tf32) counts, where the checkpoint lacks it, as what runs did before it existed (--tf32 on).
struct ConfigComparison {
  std::string refusal;
  std::string changes;
};
ConfigComparison compare_config(const nlohmann::json& written, const nlohmann::json& now, const std::string& file);

// The checkpoint's tensors against the model they are for, as strictly for a file without a checksum
// (written before checksums existed) as for one with: every weight and optimizer value finite, the
// optimizer's step count within the run's, and past the first step every parameter's optimizer state
// present (`params`: the model's parameter names; `o`: which optimizer, with what momentum). Errors
// (PermanentError) name the file and the tensor.
void check_content(const Resumed& r, const std::vector<std::string>& params, const TrainerOptions& o);

}  // namespace ringtrain::runtime
