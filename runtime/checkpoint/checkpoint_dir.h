// runtime/checkpoint/checkpoint_dir.h: a run's checkpoint folder. Files are DIR/ckpt-stepNNNNNNNN.h5 (io/checkpoint.h:
// model, optimizer, and the run's TrainState as /meta/json), written atomically by rank 0. Every checkpoint
// carries its run's identity (TrainState::run_id: made when a run starts afresh, kept by every resume of
// it), so a folder knows whose files it holds: keep_last > 0 deletes all but the newest keep_last of this
// run's own files after each save and never another run's; files set aside are renamed, never over an
// existing name. `--resume auto` takes the newest file that loads and parses, skipping (with a warning
// naming it) any half-written, foreign or corrupt one; temporary files left by an interrupted write are
// removed on the next start. TrainState is the typed metadata: every field is checked on load and an error
// names the file and the key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "io/checkpoint.h"

namespace ringtrain::runtime {

struct LossScaleState {
  double scale = 0;
  int64_t growth_tracker = 0;
};

struct TrainState {
  int64_t step = 0;             // optimizer steps taken
  data::SamplerState position;  // where the next step starts, in sampler batches of per_step_global
  int world_size = 1;
  int64_t global_batch = 0;     // images per optimizer step (all ranks, all micro-batches)
  int64_t per_step_global = 0;  // images per sampler batch (ranks x per-rank batch)
  double lr = 0;                // the last step's rate (for humans)
  uint64_t rng_stream = 0;      // the default generator's next stream (dropout masks resume exactly)
  std::optional<LossScaleState> loss_scale;
  nlohmann::json config = nlohmann::json::object();  // the run's flags as given
  std::string run_id;                                // 16 hex digits; "" in files written before runs had an identity
  // Whether step = epoch x steps per epoch + batch / accum holds (false once a resume changed the global
  // batch: the steps before it were of another size).
  bool steps_follow_position = true;

  std::string to_json() const;
  // Errors name `file` and the key that is missing or wrong.
  static TrainState from_json(const std::string& text, const std::string& file);
  // The position as a count of this run's sampler batches (per_step_global images each), for a run whose
  // epoch has micro_per_epoch of them: a checkpoint of another world size at the same global batch
  // continues at the same sample. Errors name `file` when the samples done are not a whole number of this
  // run's batches.
  // round_down: take the whole batches done instead (a run that accepted another global batch; it sees
  // less than one batch of samples twice).
  data::SamplerState position_for(int64_t per_step_global, int64_t micro_per_epoch, const std::string& file,
                                  bool round_down = false) const;
};

// A fresh run identity: 16 hex digits from the system's random source.
std::string new_run_id();

class CheckpointDir {
 public:
  // An empty folder means checkpoints are off (save and every lookup are no-ops).
  explicit CheckpointDir(std::filesystem::path dir = {}, int64_t keep_last = 0);
  bool on() const { return !dir_.empty(); }
  const std::filesystem::path& dir() const { return dir_; }

  std::filesystem::path path(int64_t step) const;
  // Every ckpt-step*.h5 in the folder, by step, oldest first (names only; nothing is opened). A name of that
  // form that is not a regular file (a folder, a dangling link) is passed to `odd`, when given.
  std::vector<std::pair<int64_t, std::filesystem::path>> list(
      const std::function<void(const std::string&)>& odd = {}) const;

  // A checkpoint of the folder and the run it belongs to (read from /meta/json only).
  struct Entry {
    int64_t step = 0;
    std::filesystem::path path;
    std::string run_id;   // "" for a file written before runs had an identity
    std::string problem;  // set when its /meta/json cannot be read (then run_id means nothing)
  };
  std::vector<Entry> scan() const;
  // The run whose files this folder's keep_last and set-asides may touch: `run_id`'s, and with
  // `owns_unmarked` also the files without an identity (a resumed file without one: they are its run's).
  void set_run(std::string run_id, bool owns_unmarked);
  bool owns(const Entry& e) const {
    return e.problem.empty() && (e.run_id == run_id_ || (owns_unmarked_ && e.run_id.empty()));
  }

  struct Loaded {
    std::filesystem::path path;
    Checkpoint checkpoint;
    TrainState state;
  };
  // Loads one file and parses its state; errors name the file.
  static Loaded load(const std::filesystem::path& path);
  // The newest checkpoint that loads; each newer one that does not is passed to `warn` with the reason.
  std::optional<Loaded> load_newest(const std::function<void(const std::string&)>& warn) const;

  // Writes step's checkpoint (atomically), then applies keep_last to this run's own files. Returns the path.
  std::filesystem::path save(int64_t step, const Checkpoint& checkpoint, const SaveOptions& options = {}) const;
  // A run resumed from an older checkpoint replaces the later ones of its own run in the folder: they are
  // renamed to "<name>.superseded" ("<name>.superseded-2", ... when that exists: nothing set aside before is
  // overwritten), kept but no longer picked by --resume auto; returns the new names.
  std::vector<std::string> supersede_after(int64_t step) const;
  // --start-over: moves `files` into a new folder DIR/set-aside-<date>-<time>[-N] (a new name every time);
  // returns it.
  std::filesystem::path move_aside(const std::vector<Entry>& files) const;
  // Removes temporary files of interrupted writes (.ckpt-step*.h5.tmp-*); returns their names.
  std::vector<std::string> remove_stale_temp_files() const;
  // Creates the folder and proves it writable with a probe file of the longest name the run will write
  // there (a temporary checkpoint of step `max_step`, a set-aside name), so a path too long for the file
  // system fails now, not at the first checkpoint. Errors name the flag and the folder.
  void check_writable(int64_t max_step = 99999999) const;
  // "" when `path` (an output of the run, given as `flag`: --log-jsonl, --trace) may be written, else why
  // not: it is this folder, or a file in it named like the folder's own (checkpoints, their temporary
  // files, the lock, set-aside folders), which the folder's bookkeeping would replace or delete.
  std::string output_problem(const std::string& flag, const std::string& path) const;

 private:
  std::filesystem::path dir_;
  int64_t keep_last_;
  std::string run_id_;
  bool owns_unmarked_ = false;
};

// The checkpoints of `entries` that a run may not take as its own (another run's, or unreadable), and a
// line naming them by run and steps: "run 3f2a1b0c9d8e7f60 (steps 3-12, 4 files)".
std::vector<CheckpointDir::Entry> others_of(const CheckpointDir& dir, const std::vector<CheckpointDir::Entry>& entries);
std::string describe_entries(const std::vector<CheckpointDir::Entry>& entries);

}  // namespace ringtrain::runtime
