// runtime/memory/plan_memory.h: the memory plan of a run as ranks make it (runtime/memory/memory_plan.h is its pure
// model): each rank's measured facts and budget, and the collective plan before fit()'s run is built.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/world.h"
#include "runtime/cluster/watchdog.h"
#include "runtime/config/data_source.h"
#include "runtime/config/options.h"
#include "runtime/memory/memory_plan.h"

namespace ringtrain::runtime {

// This rank's measured facts: the probe's curve (probe_activations), the baseline (the resident set or the
// device's tensors, less the probe's), the parameters, one image, the input batches in flight.
MemoryFacts measure_memory_facts(const TrainerOptions& o, Device device, Module& model, const DataSource& data,
                                 const StepFn& step_fn);
// This rank's budget: --max-memory, else its share of its device's free memory (runtime/memory/memory_budget.h).
struct RankBudget {
  int64_t bytes = 0;
  std::string source;  // "--max-memory", or the free memory and the ranks sharing it
};
RankBudget rank_budget_of(const TrainerOptions& o, const comm::World& world, Device device);

// Collective, before fit()'s run is built: every rank measures its facts and budget; rank 0 resolves -b auto
// and --global-batch (into o.batch and o.accum) for every rank's budget, and refuses a run some rank's budget
// does not hold, naming the remedies that fit. A model the probe cannot train skips the plan with a warning
// (unless -b auto or --max-memory needs it). Returns the plan record's "memory" part (null when no plan).
nlohmann::json plan_memory(comm::World& world, TrainerOptions& o, Device device, Watchdog& dog, Module& model,
                           DataSource& data, const StepFn& step_fn);

}  // namespace ringtrain::runtime
