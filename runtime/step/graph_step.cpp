// runtime/step/graph_step.cpp: the step captured as a CUDA graph and replayed.
#include "runtime/step/graph_step.h"

#include <cstdio>
#include <optional>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/profile.h"
#include "runtime/telemetry/run_log.h"

namespace ringtrain::runtime {

void GraphStep::off(int64_t step, const std::string& why) {
  off_ = why;
  if (context_.world.is_root())
    std::fprintf(stderr, "%s: --cuda-graph: not captured at step %lld, the steps run op by op: %s\n",
                 context_.options.program.c_str(), static_cast<long long>(step), why.c_str());
  context_.write_record(cuda_graph_record(step, why));
}

StepRunner::Micro GraphStep::micro_batches(int64_t epoch, int64_t step, int64_t& micro) {
  const StepContext& c = context_;
  if (!off_.empty() || step < c.first_step + kGraphWarmupSteps || micro + c.plan.accum > c.plan.micro_per_epoch)
    return OpByOpStep::micro_batches(epoch, step, micro);  // which also ends the epoch where its batches run out
  PhaseTimes& time = c.timer.current();
  Micro m;
  const auto read_start = Clock::now();
  m.begin = read_start;
  c.watchdog.phase("data loading", step);
  std::vector<data::Batch> batches;
  {
    profile::Span span("data", c.device, "data loading");
    for (int64_t k = 0; k < c.plan.accum; ++k) {
      std::optional<data::Batch> b = c.data.next();
      if (!b) return {};
      batches.push_back(std::move(*b));
    }
  }
  const int64_t first = micro;
  micro += c.plan.accum;
  const auto read_end = Clock::now();
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && a.device() == b.device();
  };
  bool fits = !slots_.empty();
  for (size_t k = 0; fits && k < batches.size(); ++k)
    fits = same(slots_[k].images, batches[k].images) && same(slots_[k].labels, batches[k].labels);
  std::string why;
  if (!graph_.ready()) {
    why = c.replica.replayable();
    if (!why.empty()) off(step, "the optimizer step cannot be captured: " + why);
  }
  if (!why.empty() || (graph_.ready() && !fits)) {  // op by op (other shapes: an epoch's short last batch)
    WeightCastScope casts;
    for (int64_t k = 0; k < c.plan.accum; ++k)
      micro_step(batches[static_cast<size_t>(k)], k, epoch, step, first + k, m, k == 0 ? read_start : Clock::now(),
                 k == 0 ? read_end : Clock::now());
    m.ran = true;
    return m;
  }
  c.watchdog.phase("forward and backward (CUDA graph)", step);
  {
    NoGradGuard no_grad;
    if (slots_.empty()) {  // made outside the capture: they outlive it, and every replay reads them
      for (const data::Batch& b : batches)
        slots_.push_back(data::Batch{b.images.detach().clone(), b.labels.detach().clone(), b.valid, b.index});
    } else {
      for (size_t k = 0; k < batches.size(); ++k) {
        slots_[k].images.copy_(batches[k].images);
        slots_[k].labels.copy_(batches[k].labels);
      }
    }
  }
  c.replica.stage(c.lr.at(step));
  step_ = step;
  if (!graph_.ready()) {
    // The step from its micro-batches to its zeroed gradients, reading the slots: captured, or (the capture
    // failed) run once. It lives with the graph (an emulated graph, core/device.h, runs it at each replay).
    // capturing: a draw of the host's generator (dropout's masks) would be baked into every replay: refused.
    work_ = [this](bool capturing) {
      const StepContext& c = context_;
      const uint64_t draws = rng_stream();
      WeightCastScope casts;
      losses_.assign(static_cast<size_t>(c.plan.accum), Tensor());
      for (int64_t k = 0; k < c.plan.accum; ++k) {
        set_sample_draws(micro_draws(step_, k));
        const Tensor loss = c.replica.forward(slots_[static_cast<size_t>(k)]);
        losses_[static_cast<size_t>(k)] = loss.detach();
        c.replica.backward(loss, k + 1 == c.plan.accum);
      }
      c.replica.finish_gradients();
      c.replica.apply_and_zero();
      if (capturing && rng_stream() != draws)
        RT_THROW("the step draws random numbers on the host (dropout): every replay would use this step's");
    };
    // The op-by-op steps' cached blocks back to the device first: the graph keeps a pool of its own (its
    // stream's, core/device.h), which would otherwise sit beside them for the rest of the run.
    empty_cache(c.device);
    const uint64_t draws = rng_stream();
    const bool captures = c.device.is_cuda();  // else emulated: nothing is baked in
    why = graph_.capture(c.device, [this, captures] { work_(captures); });
    if (!why.empty()) {
      // Nothing of the capture ran: this step runs op by op below, as if the capture had not been tried.
      c.replica.discard_step();
      set_rng_stream(draws);
      empty_cache(c.device);  // the capture's blocks
      off(step, why);
      work_(false);
    } else {
      c.write_record(cuda_graph_record(step, ""));
      if (c.world.is_root())
        std::printf("%s: --cuda-graph: the step was captured at step %lld and is replayed from here%s\n",
                    c.options.program.c_str(), static_cast<long long>(step),
                    captures ? "" : " (emulated on the CPU: RINGTRAIN_CUDA_GRAPH_EMULATE)");
    }
  }
  if (graph_.ready()) graph_.replay();
  for (int64_t k = 0; k < c.plan.accum; ++k) add_loss(losses_[static_cast<size_t>(k)], {epoch, step, first + k});
  const auto replay_end = Clock::now();
  time.data_wait += seconds(read_end - read_start);
  time.backward += seconds(replay_end - read_end);  // the whole step, its optimizer included, in one launch
  c.trace.span("data_wait", read_start, read_end, step);
  c.trace.span("cuda graph replay", read_end, replay_end, step);
  m.backward_start = read_end;
  m.backward_end = replay_end;
  m.ran = true;
  m.whole = true;
  return m;
}

}  // namespace ringtrain::runtime
