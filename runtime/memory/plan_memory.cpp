// runtime/memory/plan_memory.cpp: the memory plan of a run, collective (plan_memory), and the facts each rank
// measures for it (measure_memory_facts) and its budget.
#include "runtime/memory/plan_memory.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <span>

#include "comm/host_collectives.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/clock.h"
#include "layers/recompute.h"
#include "runtime/cluster/watchdog.h"
#include "runtime/memory/memory_budget.h"
#include "runtime/memory/memory_plan.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

MemoryFacts measure_memory_facts(const TrainerOptions& o, Device device, Module& model, const DataSource& data,
                                 const StepFn& step_fn) {
  const DataInfo& info = data.info();
  MemoryFacts f;
  f.cuda = device.is_cuda();
  f.peak_so_far = f.cuda ? 0 : static_cast<int64_t>(peak_rss_bytes());
  for (const auto& [name, p] : model.named_parameters())
    if (p.requires_grad()) f.param_bytes += p.nbytes();
  f.image_bytes = info.height * info.width * info.channels * 4 + 8;
  f.batches_in_flight = data.batches_in_flight();
  const AllocatorStats before = memory_stats(device);
  f.curve = probe_activations(o, device, model, info, step_fn);
  if (f.cuda) {
    f.baseline = before.allocated_bytes;  // the weights; the probe gave its cached blocks back (memory_plan.h)
  } else {
    // The heap keeps what tensors freed (core/allocator.h, cpu_malloc_reuse), so the resident set is what
    // is not a tensor (libraries, their first-use buffers, the data) plus the tensors' high-water mark.
    // The baseline is the first and the tensors held now (the weights): the run's tensors come on top.
    // Without that reuse (RINGTRAIN_MALLOC_DEFAULTS=1) freed blocks go back: only the held ones are resident.
    const int64_t high = cpu_malloc_reuse() ? std::max(before.peak_allocated_bytes, f.curve.high_water)
                                            : memory_stats(device).allocated_bytes;
    f.baseline = std::max<int64_t>(0, resident_bytes() - high) + memory_stats(device).allocated_bytes;
  }
  return f;
}

RankBudget rank_budget_of(const TrainerOptions& o, const comm::World& world, Device device) {
  RankBudget budget;
  const bool cuda = device.is_cuda();
  if (o.max_memory > 0) {
    budget.bytes = o.max_memory;
    budget.source = "--max-memory";
  } else {
    const FreeMemory free = cuda ? device_free_memory(device) : host_free_memory();
    const int sharing = cuda ? 1 : world.local_size();
    const int64_t held = cuda ? memory_stats(device).reserved_bytes : resident_bytes();
    budget.bytes = rank_budget(free.bytes, held, sharing);
    budget.source = detail::str_cat(free.str(), sharing > 1 ? detail::str_cat(" / ", sharing, " local ranks") : "");
  }
  return budget;
}

// The memory plan (runtime/memory/memory_plan.h), collective: every rank probes what a micro-batch costs it; rank 0
// resolves -b auto and --global-batch for every rank's budget, and refuses a run some rank's budget does not
// hold (naming the remedies that fit) before anything else is built. Returns the plan record's part.
nlohmann::json plan_memory(comm::World& world, TrainerOptions& o, Device device, Watchdog& dog, Module& model,
                           DataSource& data, const StepFn& step_fn) {
  // --global-batch with a given -b: the accumulation that makes it (with -b auto the plan chooses both).
  if (o.global_batch > 0 && o.batch > 0) {
    const int64_t per = o.batch * (world.size() / o.pipeline_stages);
    if (o.global_batch % per != 0)
      RT_THROW_PERMANENT("--global-batch ", o.global_batch, " is not a multiple of -b ", o.batch, " x ",
                         world.size() / o.pipeline_stages, o.pipeline_stages > 1 ? " replicas" : " ranks");
    o.accum = o.global_batch / per;
  }
  // A stage's memory is its blocks' (the pipeline's own plan measures them).
  if (o.pipeline_stages > 1) return json();
  dog.phase("startup: the memory plan (a forward and backward of a few images)", 0);
  const auto plan_start = Clock::now();
  const DataInfo& info = data.info();
  MemoryFacts f;
  RankBudget budget;
  std::string error;
  error = comm::failure_of([&] {
    f = measure_memory_facts(o, device, model, data, step_fn);
    budget = rank_budget_of(o, world, device);
  });
  // A model the probe cannot train (say, one that needs real labels) skips the plan, unless the run needs it.
  const bool failed = comm::all_reduce(world.comm(), int64_t{error.empty() ? 0 : 1}, comm::HostOp::Max) > 0;
  if (failed && o.batch > 0 && o.max_memory == 0) {
    if (world.is_root())
      std::fprintf(stderr, "%s: warning: no memory plan (no predicted peak, no budget check): %s\n", o.program.c_str(),
                   error.empty() ? "its probe failed on another rank" : error.c_str());
    return json();
  }
  comm::agree_or_throw(world.comm(), error, "the memory plan (which -b auto and --max-memory need)", true);
  const int64_t mine[5] = {f.baseline, f.peak_so_far, f.curve.fixed, f.curve.per_image, budget.bytes};
  const std::vector<int64_t> all = comm::all_gather(world.comm(), std::span<const int64_t>(mine, 5));
  const auto n = static_cast<size_t>(world.size());
  auto facts_of = [&](size_t r) {
    MemoryFacts g = f;
    g.baseline = all[5 * r];
    g.peak_so_far = all[5 * r + 1];
    g.curve = {all[5 * r + 2], all[5 * r + 3]};
    return g;
  };
  // Rank 0 decides: the batch and accumulation, or the refusal.
  int64_t decided[2] = {o.batch, o.accum};
  error.clear();
  if (world.is_root()) {
    try {
      if (o.batch == 0) {
        const int64_t max_batch = std::max<int64_t>(1, info.train_size / world.size() / o.accum);
        AutoBatch best{0, 1};
        for (size_t r = 0; r < n; ++r) {
          const AutoBatch b = choose_batch(o, facts_of(r), world.size(), all[5 * r + 4], max_batch);
          if (best.batch == 0 || b.batch < best.batch) best = b;
        }
        decided[0] = best.batch;
        decided[1] = best.accum;
      }
      TrainerOptions v = o;
      v.batch = decided[0];
      v.accum = decided[1];
      size_t worst = 0;
      int64_t over = INT64_MIN;
      bool fit = true;
      for (size_t r = 0; r < n; ++r) {
        const int64_t predicted = predict_peak(v, facts_of(r), world.size()).total;
        fit = fit && fits(predicted, all[5 * r + 4]);
        if (predicted - all[5 * r + 4] > over) over = predicted - all[5 * r + 4], worst = r;
      }
      if (!fit) {
        const MemoryFacts g = facts_of(worst);
        const int64_t budget_w = all[5 * worst + 4];
        auto probe = [&](const TrainerOptions& w) {
          if (w.recompute != v.recompute) recompute_blocks(model, w.recompute);
          const ActivationCurve c = probe_activations(w, device, model, info, step_fn);
          if (w.recompute != v.recompute) recompute_blocks(model, v.recompute);
          return c;
        };
        const std::vector<Remedy> fixes = remedies(v, g, world.size(), budget_w, probe);
        std::string list, stages;
        for (const Remedy& r : fixes) {
          list += detail::str_cat("\n  ", r.flags, ": ", format_bytes(r.prediction.total));
          if (r.flags.find("--pipeline-stages") != std::string::npos)
            stages = "\n(the memory plan predicts one-stage runs only: run --pipeline-stages without --max-memory)";
        }
        error = detail::str_cat(
            "the run does not fit: rank ", worst, " is predicted to reach ", predict_peak(v, g, world.size()).str(),
            " at batch ", v.batch, ", over its budget of ", format_bytes(budget_w), " less 5% to spare (",
            worst == 0 ? budget.source : std::string("its share of its device's free memory"), "). ",
            fixes.empty() ? "Nothing ringtrain can change fits it; free memory or raise --max-memory"
                          : "These changes fit, with their predicted peaks:" + list,
            fixes.empty() ? "" : "\n(or raise --max-memory)", stages,
            detail::str_cat("\n(planned in ", std::lround(1000 * seconds(Clock::now() - plan_start)),
                            " ms, before any step)"));
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  comm::agree_or_throw(world.comm(), error, "the memory plan", true);
  decided[0] = comm::broadcast(world.comm(), decided[0], 0);
  decided[1] = comm::broadcast(world.comm(), decided[1], 0);
  const bool chosen = o.batch == 0;
  o.batch = decided[0];
  o.accum = decided[1];
  json by_rank = json::array(), budgets = json::array();
  MemoryPrediction top;
  for (size_t r = 0; r < n; ++r) {
    const MemoryPrediction p = predict_peak(o, facts_of(r), world.size());
    by_rank.push_back(p.total);
    budgets.push_back(all[5 * r + 4]);
    if (r == 0) top = p;
  }
  if (world.is_root()) {
    if (chosen)
      std::printf("-b auto: batch %lld x accum %lld per rank, the largest micro-batch the memory budget holds%s\n",
                  static_cast<long long>(o.batch), static_cast<long long>(o.accum),
                  o.global_batch > 0 ? detail::str_cat(" for --global-batch ", o.global_batch).c_str() : "");
    std::printf("memory: rank 0 predicted to peak at %s; budget %s (%s)\n", top.str().c_str(),
                format_bytes(all[4]).c_str(), budget.source.c_str());
    std::fflush(stdout);
  }
  json breakdown = top.to_json();
  return {{"predicted_peak_mem_bytes_by_rank", by_rank},
          {"budget_bytes_by_rank", budgets},
          {"budget", budget.source},
          {"breakdown", breakdown},
          {"activations_fixed", f.curve.fixed},
          {"activations_per_image", f.curve.per_image},
          {"batch_auto", chosen}};
}

}  // namespace ringtrain::runtime
