// apps/bench_step: synthetic data: median training-step time, img/s and peak memory of any model of the zoo
// (layers/models/zoo.h: the ResNets, mobilenet_v2, efficientnet_b*, convnext_*, unet; forward, softmax
// cross-entropy, per pixel for the UNet, backward, SGD with momentum and weight decay).
//   bench_step -a resnet20 -b 128 --threads 1 [--hw 32] [--in-ch 3] [--steps 10] [--warmup 2]
//              [--device cpu] [--precision fp32|bf16|fp16] [--tf32 on|off] [--backend ring] [--bucket-mb 25]
//              [--cpu-conv auto]
// Prints one line: "ringtrain resnet20 b128 32x32x3 threads=1 median_step_s=... img_per_s=... peak_rss_mb=...
// params=..." (params: the model's parameter count, which scripts/peers/torch_resnet_step.py prints too);
// with --precision bf16/fp16 it adds precision=... (fp16 also loss_scaling=dynamic and the final loss_scale:
// it trains with train_resnet's loss scaler) and, on the CPU, cpu_half_path=... (core/cpu_features.h);
// then always tf32=on|off, the --tf32 setting in effect (it changes f32 convolutions and GEMMs on a GPU only).
// --cpu-conv compare alternates the CPU convolution choice step by step (direct, auto, direct, ...) and
// adds both medians and the median of each pair's auto/direct ratio: a comparison that holds while the
// machine's speed drifts (median_step_s is then auto's). --recompute on recomputes the activations
// (layers/recompute.h); --recompute compare alternates plain and recomputed steps the same way and adds
// plain_median_step_s and recompute_over_plain (median_step_s is then the recomputed steps'). Only one of
// the two compares at a time.
// Under mpirun it is data-parallel (GradSync over --backend, default ring; -b is per rank): the step
// time is the slowest rank's median, img/s counts every rank's images, and the line adds ranks=N and
// comm_wait_s (median time finish() waited for gradients after backward: the communication not hidden).
// --backend none under mpirun runs the ranks side by side without synchronising them.
// --profile runs --profile-steps more steps after the timed ones (which it leaves untouched) under the
// per-op profiler and prints its table (runtime/telemetry/profiler.h); --profile-jsonl PATH appends its record.
// --cuda-graph (one process on a GPU) captures the step as a CUDA graph after the warm-up and times its
// replays (core/device.h's CudaGraph); the line adds cuda_graph=on, or =failed with the reason on stderr.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>

#include "comm/grad_sync.h"
#include "comm/host_collectives.h"
#include "comm/world.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/check.h"
#include "core/cpu_features.h"
#include "core/device.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "io/files.h"
#include "layers/loss.h"
#include "layers/models/zoo.h"
#include "layers/recompute.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "runtime/config/cli.h"
#include "runtime/telemetry/profiler.h"

using namespace ringtrain;

// What bench_step's flags can do when an allocation fails (runtime::main_error).
constexpr const char* kMemoryHint = "a smaller -b or --hw, or --precision bf16";

int main(int argc, char** argv) try {
  CLI::App app{"Times training steps of a model of the zoo on synthetic data"};
  std::string arch = "resnet20", device_text = "cpu", precision = "fp32", tf32 = "on", backend = "ring",
              cpu_conv = "auto", recompute = "off";
  int64_t batch = 128, hw = 32, in_ch = 3, classes = 10;
  int threads = 0, steps = 10, warmup = 2, profile_steps = static_cast<int>(runtime::kProfileDefaultSteps);
  bool profile = false, profile_layers = false, cuda_graph = false;
  std::string profile_jsonl;
  double bucket_mb = 25;
  app.add_option("-a,--arch", arch,
                 "architecture: a ResNet, mobilenet_v2, efficientnet_b0..b7, convnext_tiny..large, unet")
      ->capture_default_str();
  runtime::add_number(app, "-b,--batch-size", batch, "images per step", 1, int64_t{1} << 16);
  runtime::add_number(app, "--threads", threads, "CPU threads (0: cores / local ranks)", 0, 1024);
  runtime::add_number(app, "--hw", hw, "image height and width", 1, 4096);
  runtime::add_number(app, "--in-ch", in_ch, "input channels", 1, 4096);
  runtime::add_number(app, "--classes", classes, "classes", 1, int64_t{1} << 20);
  runtime::add_number(app, "--steps", steps, "timed steps (median reported)", 1, 1000000);
  runtime::add_number(app, "--warmup", warmup, "untimed steps first", 0, 1000000);
  app.add_option("--device", device_text, "cpu or cuda[:i]")->capture_default_str();
  app.add_option("--precision", precision,
                 "fp32, or bf16/fp16: convolutions and GEMMs autocast to it, as train_resnet --precision (fp16 with "
                 "its dynamic loss scaling, as train_resnet's and PyTorch's GradScaler)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--tf32", tf32,
                 "on or off: f32 convolutions and GEMMs on the GPU may use TF32 tensor cores, as train_resnet --tf32 "
                 "(no effect on the CPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--backend", backend,
                 "gradient all-reduce under mpirun: ring, hierarchical, mpi or nccl; none: every rank trains alone, no "
                 "sync (the "
                 "machine's own slowdown from running ranks side by side, the ceiling for weak scaling)")
      ->capture_default_str()
      ->check(CLI::IsMember({"ring", "hierarchical", "mpi", "nccl", "none"}));
  runtime::add_number(app, "--bucket-mb", bucket_mb, "gradient bucket size under mpirun", 1e-6, 1e6);
  app.add_option("--cpu-conv", cpu_conv,
                 "CPU convolutions: auto (Winograd where faster), direct, or compare (alternate the two step by step); "
                 "default: RINGTRAIN_CPU_CONV, else auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "direct", "compare"}));
  app.add_option("--recompute", recompute,
                 "activation recompute per residual block: off, on, or compare (alternate plain and recomputed "
                 "steps)")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "on", "compare"}));
  app.add_flag("--cuda-graph", cuda_graph,
               "on a GPU, one process: capture the step (forward, loss, backward, SGD) as a CUDA graph after the "
               "warm-up and replay it for the timed steps; where capture fails, say why and time the steps as they "
               "are (--profile still profiles steps run op by op)");
  app.add_flag("--profile", profile,
               "after the timed steps, profile --profile-steps more: the table per op family (GPU time from CUDA "
               "events, host time, share of the step, host waits per step)");
  runtime::add_number(app, "--profile-steps", profile_steps, "steps --profile measures", 1, 1000000);
  app.add_flag("--profile-layers", profile_layers, "with --profile: per (layer, family) rows too");
  app.add_option("--profile-jsonl", profile_jsonl, "with --profile: append its record to this JSONL file");
  RT_PARSE_FLAGS(app, argc, argv);
  if (cpu_conv == "compare" && recompute == "compare") {
    std::fprintf(stderr, "bench_step: --cpu-conv compare and --recompute compare: compare one at a time\n");
    return 2;
  }
  const bool compare_recompute = recompute == "compare";
  const bool compare = cpu_conv == "compare" || compare_recompute;
  const bool cpu_conv_given = app.count("--cpu-conv") > 0;  // else RINGTRAIN_CPU_CONV's choice (default auto)
  set_allow_tf32(tf32 == "on");
  return comm::run_main(argc, argv, kMemoryHint, [&](comm::World& world) {
    if (const std::string p = io::clobber_problem("--profile-jsonl", profile_jsonl, true); !p.empty()) RT_THROW(p);
    const Device device = world.bind(parse_device(device_text), threads).device;
    manual_seed(0);
    const ModelInfo& info = model_info(arch);
    RT_CHECK(hw >= info.min_side && (!info.multiple_of_min || hw % info.min_side == 0), "--hw ", hw, ": ", arch,
             " takes images of at least ", info.min_side, info.multiple_of_min ? " (and a multiple of it)" : "",
             " pixels");
    const std::shared_ptr<Module> net = make_model(arch, {.in_channels = in_ch, .num_classes = classes});
    Module& model = *net;
    model.to(device);
    Sgd opt(as_named(model.named_parameters()), SgdOptions{.momentum = 0.9, .weight_decay = 5e-4});
    std::unique_ptr<comm::GradSync> sync;
    if (world.size() > 1 && backend != "none")
      sync =
          std::make_unique<comm::GradSync>(model, comm::make_communicator(comm::parse_backend(backend), world.comm()),
                                           comm::GradSyncOptions{.bucket_mb = bucket_mb});
    CrossEntropyLoss loss_fn;
    const std::optional<DType> autocast = precision == "bf16"   ? std::optional(DType::BF16)
                                          : precision == "fp16" ? std::optional(DType::F16)
                                                                : std::optional<DType>();
    // fp16 trains as train_resnet does: the loss scaled, the gradients unscaled and checked before the update
    // (one host read a step, as PyTorch's GradScaler makes), so no gradient flushes to zero or below normal.
    std::optional<GradScaler> scaler;
    std::vector<Tensor> trained;  // the scaler's: every parameter
    if (precision == "fp16") {
      scaler.emplace();
      for (const auto& [name, p] : model.named_parameters()) trained.push_back(p);
    }
    Tensor x = Tensor::normal(Shape{batch, hw, hw, in_ch}, 0, 1, 1, DType::F32, device);
    // A class per image, or (UNet) per pixel.
    const Shape label_shape = info.segmentation ? Shape{batch, hw, hw} : Shape{batch};
    std::vector<double> ys(static_cast<size_t>(label_shape.numel()));
    for (size_t i = 0; i < ys.size(); ++i) ys[i] = static_cast<double>(static_cast<int64_t>(i) % classes);
    Tensor y = Tensor::from_vector(ys, label_shape, DType::I64, device);
    std::vector<double> times, waits, base_times, ratios;
    if (!cpu_conv_given)
      cpu_convolution();  // a bad RINGTRAIN_CPU_CONV fails here, named
    else if (!compare)
      set_cpu_convolution(cpu_conv == "direct" ? CpuConvolution::Direct : CpuConvolution::Auto);
    if (recompute == "on") recompute_blocks(model);
    // In a comparison the even steps are the baseline (direct convolutions, or no recompute).
    // One training step; `s` < 0: a profiled step after the timed ones.
    auto train_step = [&](int s) {
      if (sync)
        sync->zero_grad();
      else
        opt.zero_grad();
      Tensor loss;
      {
        WeightCastScope casts;  // each weight cast once a step, as train_resnet's steps do
        {
          AutocastGuard cast(autocast);
          loss = loss_fn(model(x), y);
        }
        (scaler ? scaler->scale_loss(loss) : loss).backward();
      }
      if (sync) {
        profile::Span span("allreduce", device, "gradient all-reduce");
        sync->finish();
        if (s >= warmup) waits.push_back(sync->last_wait_seconds());
      }
      if (scaler)
        scaler->step(opt, trained, 0.1);
      else
        opt.step(0.1);
    };
    // --cuda-graph: the step captured once, after the warm-up (cuDNN's algorithm search done, every buffer
    // the step keeps allocated), then replayed. Refused with the reason where it cannot hold.
    CudaGraph graph;
    std::string graph_state = "off";
    auto capture_step = [&] {
      std::string why;
      if (world.size() > 1)
        why = "data-parallel steps are not captured yet (the gradient all-reduce runs from backward hooks)";
      else if (compare)
        why = "--cpu-conv compare and --recompute compare change the step between steps";
      else if (warmup < 1)
        why = "it needs at least one warm-up step first (--warmup)";
      else if (scaler)
        why = "fp16's loss scaler reads its inf check on the host every step";
      else {
        // The op-by-op steps' cached blocks back to the device first (as the Trainer does): the graph keeps a
        // pool of its own, and an out-of-memory retry inside the capture would otherwise have to free them.
        empty_cache(device);
        why = graph.capture(device, [&] { train_step(-1); });
      }
      graph_state = why.empty() ? "on" : "failed";
      if (!why.empty() && world.is_root())
        std::fprintf(stderr, "bench_step: --cuda-graph: not captured, the steps run op by op: %s\n", why.c_str());
    };
    for (int s = 0; s < (compare ? 2 : 1) * (warmup + steps); ++s) {
      if (cuda_graph && s == warmup) capture_step();
      const bool base_turn = compare && s % 2 == 0;
      if (compare_recompute)
        recompute_blocks(model, !base_turn);
      else if (compare)
        set_cpu_convolution(base_turn ? CpuConvolution::Direct : CpuConvolution::Auto);
      auto t0 = std::chrono::steady_clock::now();
      if (graph.ready())
        graph.replay();
      else
        train_step(s);
      synchronize(device);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (compare) {
        if (s / 2 < warmup) continue;
        if (base_turn) {
          base_times.push_back(dt);
          continue;
        }
        ratios.push_back(dt / base_times.back());
      }
      if (s / (compare ? 2 : 1) >= warmup) times.push_back(dt);
    }
    std::optional<profile::Table> table;
    if (profile) {
      profile::Session session(device, profile_layers);
      for (int s = 0; s < profile_steps; ++s) {
        session.begin_step();
        train_step(-1);
        session.end_step();
      }
      table = session.table();
    }
    std::sort(times.begin(), times.end());
    std::sort(waits.begin(), waits.end());
    std::sort(base_times.begin(), base_times.end());
    std::sort(ratios.begin(), ratios.end());
    double median = times[times.size() / 2], wait = waits.empty() ? 0.0 : waits[waits.size() / 2];
    double worst[3] = {median, wait, peak_rss_bytes() / (1024.0 * 1024.0)};  // the slowest / largest rank's
    comm::all_reduce(world.comm(), std::span<double>(worst, 3), comm::HostOp::Max);
    median = worst[0];
    wait = worst[1];
    const double rss_mb = worst[2];
    if (!world.is_root()) return 0;
    std::printf("ringtrain %s b%lld %lldx%lldx%lld threads=%d median_step_s=%.4f img_per_s=%.1f peak_rss_mb=%.0f",
                arch.c_str(), static_cast<long long>(batch), static_cast<long long>(hw), static_cast<long long>(hw),
                static_cast<long long>(in_ch), num_threads(), median,
                static_cast<double>(batch) * world.size() / median, rss_mb);
    int64_t params = 0;
    for (const auto& [name, p] : model.named_parameters()) params += p.numel();
    std::printf(" params=%lld", static_cast<long long>(params));
    std::printf(" tf32=%s", allow_tf32() ? "on" : "off");
    if (cuda_graph) std::printf(" cuda_graph=%s", graph_state.c_str());
    if (world.size() > 1) std::printf(" ranks=%d backend=%s comm_wait_s=%.4f", world.size(), backend.c_str(), wait);
    if (recompute != "off") std::printf(" recompute=%s", recompute.c_str());
    if (autocast) {
      std::printf(" precision=%s", precision.c_str());
      if (scaler) std::printf(" loss_scaling=dynamic loss_scale=%g", scaler->scale());
      if (device.is_cpu()) std::printf(" cpu_half_path=%s", cpu_half_path(*autocast).path.c_str());
    }
    if (compare)
      std::printf(compare_recompute ? " plain_median_step_s=%.4f recompute_over_plain=%.3f"
                                    : " direct_median_step_s=%.4f auto_over_direct=%.3f",
                  base_times[base_times.size() / 2], ratios[ratios.size() / 2]);
    std::printf("\n");
    if (table) {
      std::printf("%s", runtime::format_profile(*table).c_str());
      if (!profile_jsonl.empty()) {
        io::write_text(profile_jsonl, runtime::profile_record(*table).dump() + "\n", "--profile-jsonl", true);
      }
    }
    return 0;
  });
} catch (...) {
  return runtime::main_error("bench_step", kMemoryHint);  // no exception escapes main
}
