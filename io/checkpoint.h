// io/checkpoint.h: checkpoints in HDF5, readable with h5py. Layout:
//   /model/<dotted name>      one dataset per parameter and buffer (ringtrain layouts: conv weights KRSC)
//   /optimizer/<state name>   optimizer state ("step", "<param>.momentum", "<param>.exp_avg", ...)
//   /meta/json                string dataset with step, epoch, config, world size, ... as JSON
// Root attributes: format "ringtrain-checkpoint", format_version 1, layout "NHWC activations, KRSC filters",
// checksum "digest64:<hex>" over every tensor and the metadata, verified on load (a flipped byte is an
// error naming the file, not a NaN loss steps later).
// Datasets keep their dtype (f32, f64, i32, i64, u8 natively; f16/bf16 as uint16 with an attribute
// "dtype"). Writing is atomic: a temporary file in the same folder is written, flushed and fsync'ed,
// then renamed over the target, so a crash never leaves a torn checkpoint.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ringtrain {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct Checkpoint {
  NamedTensors model;
  NamedTensors optimizer;
  std::string meta_json = "{}";
  bool checksummed = true;  // loaded: the file carried a checksum (files written before it existed do not)
};

struct SaveOptions {
  // Test seam: runs after the temporary file is complete and synced, just before the rename.
  std::function<void()> before_rename;
};

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint, const SaveOptions& options = {});
// Errors name the file and the object (missing group, unsupported dtype, not a ringtrain checkpoint, a
// folder or FIFO where the file should be).
Checkpoint load_checkpoint(const std::filesystem::path& path);
// Only /meta/json (the format checked, no tensor read): what a folder scan needs to tell runs apart.
std::string read_checkpoint_meta(const std::filesystem::path& path);

}  // namespace ringtrain
