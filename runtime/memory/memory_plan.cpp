// runtime/memory/memory_plan.cpp: the probe, the prediction, the remedies of an over-budget run and -b auto.
#include "runtime/memory/memory_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "layers/loss.h"
#include "layers/model_state.h"
#include "layers/recompute.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

namespace {

int64_t optimizer_slots(const TrainerOptions& o) {
  if (o.optimizer == OptimizerKind::AdamW) return 2;  // exp_avg, exp_avg_sq
  return o.momentum > 0 ? 1 : 0;                      // the momentum buffer
}

}  // namespace

json MemoryPrediction::to_json() const {
  return {{"baseline", baseline}, {"gradients", gradients},     {"optimizer_state", optimizer_state},
          {"wire", wire},         {"activations", activations}, {"heap_gap", heap_gap},
          {"input", input}};
}

std::string MemoryPrediction::str() const {
  std::string s = detail::str_cat(format_bytes(total), " (baseline ", format_bytes(baseline), ", gradients ",
                                  format_bytes(gradients));
  if (optimizer_state > 0) s += detail::str_cat(", optimizer state ", format_bytes(optimizer_state));
  if (wire > 0) s += detail::str_cat(", compressed gradients ", format_bytes(wire));
  s += detail::str_cat(", activations ", format_bytes(activations));
  if (heap_gap > 0) s += detail::str_cat(", heap gaps ", format_bytes(heap_gap));
  return s + detail::str_cat(", input batches ", format_bytes(input), ")");
}

MemoryPrediction predict_peak(const TrainerOptions& o, const MemoryFacts& f, int world_size) {
  RT_CHECK(world_size >= 1 && o.batch >= 1 && o.pipeline_stages >= 1, "predict_peak: world size ", world_size,
           ", batch ", o.batch, ", stages ", o.pipeline_stages);
  MemoryPrediction p;
  const int64_t stages = o.pipeline_stages;
  // A stage holds its share of the model's state; under 1F1B the first stage keeps the activations of up
  // to `stages` micro-batches of its 1/stages of the blocks: about one micro-batch of the whole model.
  const int64_t params = (f.param_bytes + stages - 1) / stages;
  const int64_t holders = world_size / stages;
  p.baseline = f.baseline;
  p.gradients = params;
  const int64_t state = optimizer_slots(o) * params;
  p.optimizer_state = o.zero == 1 ? (state + holders - 1) / holders : state;
  p.wire = o.compression == comm::Compression::None ? 0 : params / 2;
  p.activations = f.curve.at(o.batch);
  p.heap_gap = o.recompute && !f.cuda ? p.activations / 5 : 0;
  p.input = f.batches_in_flight * o.batch * f.image_bytes;
  p.total = std::max(f.peak_so_far,
                     p.baseline + p.gradients + p.optimizer_state + p.wire + p.activations + p.heap_gap + p.input);
  return p;
}

bool fits(int64_t predicted, int64_t budget) { return predicted + predicted / 20 <= budget; }

ActivationCurve measure_curve(int64_t per, const std::function<std::function<void()>(int64_t)>& pass,
                              const ProbeMeter& meter) {
  RT_CHECK(per >= 1, "the memory plan's probe: ", per, " images per pass");
  const int64_t sizes[2] = {per, 2 * per};
  int64_t cost[2] = {0, 0}, high_water = 0;
  for (int i = 0; i < 2; ++i) {
    const std::function<void()> run = pass(sizes[i]);  // holds the batch until the next pass
    // A caching allocator's reserve only grows: read there, the second pass would stand on the first's
    // blocks, which its twice as large requests cannot use, and the line would count both (ResNet-18
    // bf16 on an H200: 25.8 MB an image against the 11.9 its tensors hold). Its tensors' high-water mark,
    // from an empty cache, is what the run's tensors reach.
    if (meter.release_cache) meter.release_cache();
    const int64_t before = meter.stats().allocated_bytes;
    meter.reset_peak();
    run();
    const int64_t peak = meter.stats().peak_allocated_bytes;
    cost[i] = std::max<int64_t>(0, peak - before);
    high_water = std::max(high_water, peak);
  }
  ActivationCurve c;
  c.per_image = std::max<int64_t>(0, (cost[1] - cost[0]) / per);
  c.fixed = std::max<int64_t>(0, cost[0] - c.per_image * per);
  c.high_water = high_water;
  return c;
}

ActivationCurve probe_activations(const TrainerOptions& o, Device device, Module& model, const DataInfo& info,
                                  const StepFn& step_fn) {
  RT_CHECK(info.height > 0 && info.width > 0 && info.channels > 0, "the memory plan's probe: the data's image shape ",
           info.height, "x", info.width, "x", info.channels, " is not known");
  // The probe trains: BatchNorm statistics, the generator's stream and the gradients are put back after it,
  // also when it throws.
  std::optional<ModelStateGuard> untouched(std::in_place, model);
  // Gradients exist before the first step (GradSync's buckets): they are state, not the micro-batch's.
  for (auto& [name, p] : model.named_parameters())
    if (p.requires_grad()) p.set_grad(Tensor::zeros(p.shape(), p.dtype(), device));
  const CrossEntropyLoss loss_fn(loss_options(o));
  const std::optional<DType> autocast = autocast_type(o.precision);
  // Batches of one and two images per compute thread on the CPU (at least two: batch norm needs two values
  // per channel): kernels split work by image, and the run's steps give every thread some. On CUDA 8 and
  // 16: at 2 and 4 the caching allocator's rounding of the probe's 1-4 MiB tensors to 128 KiB added 2-3%
  // to the per-image cost (ResNet-18 bf16 at 224x224: 12.3 MB against 11.9).
  const int64_t per = device.is_cuda() ? 8 : std::max(2, num_threads());
  auto pass = [&](int64_t b) -> std::function<void()> {
    // Random images, not zeros: with --recompute the block inputs kept are packed by their zeros
    // (core/pack.h), and a zero batch would make every activation zero. A fixed seed, not the run's
    // generator; batch norm makes the activations' density what it is on real data at the start.
    auto batch = std::make_shared<data::Batch>();
    batch->images =
        Tensor::normal(Shape{b, info.height, info.width, info.channels}, 0.0, 1.0, /*seed=*/0x5eed, DType::F32, device);
    batch->labels = probe_labels(info, b, device);
    batch->valid = b;
    synchronize(device);
    return [&, batch] {
      {
        Tensor loss;
        {
          AutocastGuard scope(autocast);
          loss = step_fn ? step_fn(model, *batch) : loss_fn(model(batch->images), batch->labels);
        }
        RT_CHECK(loss.defined() && loss.numel() == 1, "the memory plan's probe: the step function must return a ",
                 "scalar loss, got ", loss.defined() ? loss.describe() : std::string("an undefined tensor"));
        if (loss.requires_grad()) loss.backward();
      }
      synchronize(device);
    };
  };
  ProbeMeter meter{[device] { return memory_stats(device); }, [device] { reset_peak_memory(device); }, {}};
  if (device.is_cuda()) meter.release_cache = [device] { empty_cache(device); };
  const ActivationCurve c = measure_curve(per, pass, meter);
  untouched.reset();
  // The probe's blocks are smaller than the run's requests, which they would not serve (a cached block
  // serves requests of 4/5 of its size or more): kept, they would only add to the device's reserve.
  if (device.is_cuda()) empty_cache(device);
  return c;
}

std::vector<Remedy> remedies(const TrainerOptions& o, const MemoryFacts& f, int world_size, int64_t budget,
                             const std::function<ActivationCurve(const TrainerOptions&)>& probe) {
  std::vector<Remedy> out;
  auto facts_for = [&](const TrainerOptions& v) {
    MemoryFacts g = f;
    if (v.recompute != o.recompute || v.precision != o.precision) g.curve = probe(v);
    return g;
  };
  // The largest divisor of the micro-batch (the global batch kept through accumulation) that fits.
  auto split = [&](const TrainerOptions& v, const MemoryFacts& g, std::string flags) -> std::optional<Remedy> {
    for (int64_t b = v.batch; b >= 1; --b) {
      if (v.batch % b != 0) continue;
      TrainerOptions w = v;
      w.batch = b;
      w.accum = v.accum * (v.batch / b);
      const MemoryPrediction p = predict_peak(w, g, world_size);
      if (!fits(p.total, budget)) continue;
      if (b != v.batch) flags += detail::str_cat(flags.empty() ? "" : " ", "-b ", b, " --accum-steps ", w.accum);
      return Remedy{flags, w, p};
    }
    return std::nullopt;
  };
  auto alone = [&](const TrainerOptions& v, const std::string& flags) {
    const MemoryPrediction p = predict_peak(v, facts_for(v), world_size);
    if (fits(p.total, budget)) out.push_back({flags, v, p});
  };
  if (o.batch > 1)
    if (auto r = split(o, f, "")) out.push_back(*r);
  TrainerOptions all = o;
  std::string all_flags;
  auto lever = [&](bool applies, const std::string& flags, const std::function<void(TrainerOptions&)>& set) {
    if (!applies) return;
    TrainerOptions v = o;
    set(v);
    alone(v, flags);
    set(all);
    all_flags += (all_flags.empty() ? "" : " ") + flags;
  };
  lever(!o.recompute && o.pipeline_stages == 1, "--recompute", [](TrainerOptions& v) { v.recompute = true; });
  lever(o.precision == Precision::FP32, "--precision bf16", [](TrainerOptions& v) { v.precision = Precision::BF16; });
  lever(world_size > 1 && o.zero == 0 && o.compression == comm::Compression::None && optimizer_slots(o) > 0, "--zero 1",
        [](TrainerOptions& v) { v.zero = 1; });
  // Two stages of half the replicas: the micro-batches double to keep the global batch.
  if (o.pipeline_stages == 1 && world_size % 2 == 0 && o.zero == 0) {
    TrainerOptions v = o;
    v.pipeline_stages = 2;
    v.accum = o.accum * 2;
    alone(v, detail::str_cat("--pipeline-stages 2 --accum-steps ", v.accum));
  }
  if (out.empty() && !all_flags.empty())
    if (auto r = split(all, facts_for(all), all_flags)) out.push_back(*r);
  return out;
}

AutoBatch choose_batch(const TrainerOptions& o, const MemoryFacts& f, int world_size, int64_t budget,
                       int64_t max_batch) {
  auto fits = [&](int64_t b, int64_t a) {
    TrainerOptions v = o;
    v.batch = b;
    v.accum = a;
    return runtime::fits(predict_peak(v, f, world_size).total, budget);
  };
  auto at_one = [&] {
    TrainerOptions v = o;
    v.batch = 1;
    return predict_peak(v, f, world_size);
  };
  if (!fits(1, 1))
    RT_THROW_PERMANENT("-b auto: not even a micro-batch of 1 fits the memory budget of ", format_bytes(budget),
                       ": it is predicted to reach ", at_one().str(),
                       "; raise --max-memory, or add --recompute, --precision bf16 or --zero 1");
  if (o.global_batch > 0) {
    if (o.global_batch % world_size != 0)
      RT_THROW_PERMANENT("--global-batch ", o.global_batch, " is not a multiple of the ", world_size, " ranks");
    const int64_t per_rank = o.global_batch / world_size;
    for (int64_t a = 1; a <= per_rank; ++a)
      if (per_rank % a == 0 && per_rank / a <= max_batch && fits(per_rank / a, a)) return {per_rank / a, a};
    RT_THROW_PERMANENT("-b auto --global-batch ", o.global_batch, ": no micro-batch that divides its ", per_rank,
                       " images per rank fits the memory budget of ", format_bytes(budget));
  }
  // The prediction is linear in the batch: solve, then step down past any rounding.
  const int64_t per_image = f.curve.per_image + f.batches_in_flight * f.image_bytes;
  int64_t b = max_batch;
  if (per_image > 0) {
    TrainerOptions v = o;
    v.batch = 1;
    const int64_t room = budget * 20 / 21 - predict_peak(v, f, world_size).total;
    b = std::min<int64_t>(max_batch, 1 + std::max<int64_t>(0, room) / per_image);
  }
  while (b > 1 && !fits(b, o.accum)) --b;
  return {std::max<int64_t>(1, b), o.accum};
}

int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  long long size = 0, resident = 0;
  if (!(in >> size >> resident)) return static_cast<int64_t>(peak_rss_bytes());
  return static_cast<int64_t>(resident) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace ringtrain::runtime
