// runtime/layout/layout_probe.h: what the layout planner (layout_plan.h) measures before the first step, and
// --layout auto itself.
//
//   measure_compute   every block's forward and backward (the loss's with the last) at two micro-batch
//                     sizes, scaled to whole steps measured at the same sizes, and the optimizer's update
//                     per byte, on this rank; the model is left as it was
//   measure_link      a few all-reduce sizes inside each host (all hosts at once) and then across the hosts
//                     (one rank each), fitted to LinkModel's alpha-beta; well under a second
//   choose_layout     collective: both, the memory facts (with and without recompute) and the budget on every
//                     rank, the slowest rank's compute and the smallest budget; rank 0 plans, prints the table,
//                     and every rank applies the chosen layout to its options
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/world.h"
#include "core/device.h"
#include "layers/module.h"
#include "runtime/cluster/watchdog.h"
#include "runtime/config/data_source.h"
#include "runtime/config/options.h"
#include "runtime/layout/layout_plan.h"
#include "runtime/types.h"

namespace ringtrain::runtime {

// The global batch --layout auto splits: --global-batch, else -b x ranks x --accum-steps. Errors (permanent)
// name the flags: -b auto without --global-batch.
int64_t layout_global_batch(const TrainerOptions& o, int world_size);

// The micro-batch sizes the compute probe measures for a global batch over a world: the largest a layout
// uses (G / world: one stage per rank or one replica per rank, no accumulation) and a quarter of it.
std::pair<int64_t, int64_t> probe_batches(int64_t global_batch, int world_size);

// `together(failed)`, collective where given: called before every timed pass on every rank, it returns
// whether any rank's probe failed (all stop then).
ComputeProfile measure_compute(const TrainerOptions& o, Device device, Module& model, const DataInfo& info, int64_t b0,
                               int64_t b1, const std::function<bool(bool)>& together = {});
// Collective over the world: every rank returns the same model (rank 0's fit), from all-reduces of 64 KiB up
// to the model's `gradient_bytes` (at least 1 MiB, at most 16 MiB).
LinkModel measure_link(comm::World& world, Device device, int64_t gradient_bytes);
// Collective, CPU ranks on several hosts: LinkModel::inter_cpu_per_wire, while every rank runs a GEMM loop in place
// of its compute: the loop's time a ring all-reduce over the world (of the model's `gradient_bytes`, as
// measure_link sizes it) takes beyond the ring's copies, over its wire time between hosts (`contention`: how
// much slower than alone the ranks compute, ComputeProfile::contention). Well under a second.
void measure_transport_cpu(comm::World& world, LinkModel& link, int64_t gradient_bytes, double contention);
// A calibration file (measure_link's, as ringtrain_plan --save-link writes it): errors name the file and key.
LinkModel read_link_file(const std::string& path);

// What ringtrain_plan asks about a world it does not run in (each 0 or empty: the world it runs in).
struct LayoutWhatIf {
  int hosts = 0, ranks_per_host = 0;
  double link_rate = 0, link_latency = 0;    // between hosts: bytes/s, seconds (--link, --link-latency)
  double intra_rate = 0, intra_latency = 0;  // inside a host (--intra-link, --intra-latency)
  int64_t device_memory = 0;                 // a rank's budget in bytes (--device-memory)
  std::string save_link;                     // where to write the link measured here (--save-link)
  bool scaling = false;                      // --scaling: the chosen layout's speed on 1, 2, 4, ... hosts too
};

// Collective: what --layout auto measures, the plan for the world `what_if` describes, printed by rank 0 with
// what was measured here and what was given. Returns the plan record's "layout" (every rank). Trains nothing.
// With `scaling`, also the best layout of 1, 2, 4, ... hosts up to the world's (the same ranks per host and
// images per rank: weak scaling), from the same measurements, with speed-up, efficiency and communication
// share ("scaling" in the returned plan).
nlohmann::json plan_layout_what_if(comm::World& world, const TrainerOptions& o, Device device, Watchdog& dog,
                                   Module& model, DataSource& data, const StepFn& step_fn, const LayoutWhatIf& what_if);

// Collective, at fit() before the memory plan, with --layout auto: measures, plans (rank 0 prints the
// table), applies the chosen layout to `o` (the model's recompute marks are left off), and returns the plan record's
// "layout". A custom step function sees the whole model: no pipeline is considered then.
nlohmann::json choose_layout(comm::World& world, TrainerOptions& o, Device device, Watchdog& dog, Module& model,
                             DataSource& data, const StepFn& step_fn);

}  // namespace ringtrain::runtime
