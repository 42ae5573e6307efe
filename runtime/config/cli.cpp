// runtime/config/cli.cpp: the shared training flags.
#include "runtime/config/cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "core/allocator.h"
#include "core/env.h"
#include "core/parse.h"

namespace ringtrain::runtime {

namespace {

// A string flag that parses into an enum (or other type) as it is read; --help shows `shown` as default.
template <typename Parse>
CLI::Option* add_choice(CLI::App& app, const std::string& name, const std::string& help, const std::string& shown,
                        const std::vector<std::string>& choices, Parse parse) {
  return app.add_option_function<std::string>(name, parse, help)->default_str(shown)->check(CLI::IsMember(choices));
}

void add_length_flags(CLI::App& app, TrainerOptions& o, std::string& data) {
  app.add_option("--data", data, "shard folder (make_shards output with train/ and optionally test/ splits)");
  static constexpr NumberRange<int64_t> kBatch{1, int64_t{1} << 24};
  app.add_option_function<std::string>(
         "-b,--batch-size", [&o](const std::string& v) { o.batch = v == "auto" ? 0 : *to_number<int64_t>(v); },
         "images per rank per micro-batch, or auto: the largest the memory budget holds (--max-memory)")
      ->default_str(std::to_string(o.batch))
      ->type_name("auto|" + number_type_name(kBatch))
      ->check(CLI::Validator(
          [](std::string& v) {
            const std::string problem = v == "auto" ? std::string() : number_problem(v, kBatch);
            return problem.empty() ? problem : problem + " (or auto)";
          },
          ""));
  add_number(app, "--global-batch", o.global_batch,
             "images per optimizer step over all ranks: --accum-steps chosen to make it (with -b auto, the "
             "batch too); 0 = off",
             0, int64_t{1} << 40);
  add_bytes(app, "--max-memory", o.max_memory,
            "memory a rank may use (8G, 512M, 300MB): a run predicted to need more is refused before its first "
            "step, with the remedies that fit; default: the device's free memory shared by its ranks")
      ->default_str("free memory");
  add_number(app, "--epochs", o.epochs, "epochs", 1, 1000000);
  add_number(app, "--steps", o.steps, "stop after this many optimizer steps (overrides --epochs; 0 = off)", 0,
             int64_t{1} << 40);
  add_number(app, "--accum-steps", o.accum, "micro-batches per optimizer step", 1, int64_t{1} << 20);
  add_number(app, "--seed", o.seed, "seed for init, shuffling and augmentation", uint64_t{0},
             std::numeric_limits<uint64_t>::max());
}

void add_optimisation_flags(CLI::App& app, TrainerOptions& o) {
  add_positive(app, "--lr", o.lr, "base learning rate", std::numeric_limits<double>::max());
  add_number(app, "--momentum", o.momentum, "SGD momentum", 0.0, 1.0);
  add_number(app, "--wd", o.wd, "weight decay", 0.0, 1e6);
  app.add_flag("--nesterov", o.nesterov, "Nesterov momentum");
  add_number(app, "--warmup-epochs", o.warmup_epochs, "linear warmup", 0.0, 1e6);
  add_choice(app, "--lr-schedule", "cosine, step or multistep", name_of(o.lr_schedule), {"cosine", "step", "multistep"},
             [&o](const std::string& v) { o.lr_schedule = parse_lr_shape(v); });
  add_positive(app, "--lr-step-epochs", o.lr_step_epochs, "step: decay every this many epochs", 1e6);
  add_number_list(app, "--lr-milestones", o.lr_milestones,
                  "multistep: epochs, comma-separated (default 50% and 75% of the run)", NumberRange<double>{0.0, 1e6});
  add_positive(app, "--lr-gamma", o.lr_gamma, "step/multistep decay factor", 1e6);
  add_choice(app, "--lr-scaling", "none, or linear: lr x global batch / 256", name_of(o.lr_scaling), {"none", "linear"},
             [&o](const std::string& v) { o.lr_scaling = parse_lr_scaling(v); });
  add_number(app, "--label-smoothing", o.label_smoothing, "cross-entropy label smoothing", 0.0, 1.0);
  add_number(app, "--clip-grad-norm", o.clip_grad_norm,
             "scale the gradients down to this global L2 norm when it is larger (0: off)", 0.0, 1e12);
  add_choice(app, "--optimizer", "sgd or adamw", name_of(o.optimizer), {"sgd", "adamw"},
             [&o](const std::string& v) { o.optimizer = parse_optimizer(v); });
}

void add_device_flags(CLI::App& app, TrainerOptions& o) {
  add_choice(app, "--device", "auto, cpu or cuda", name_of(o.device), {"auto", "cpu", "cuda"},
             [&o](const std::string& v) { o.device = parse_device_choice(v); });
  add_choice(app, "--precision", "fp32, bf16 or fp16", name_of(o.precision), {"fp32", "bf16", "fp16"},
             [&o](const std::string& v) { o.precision = parse_precision(v); });
  add_choice(app, "--tf32",
             "on or off: f32 convolutions and GEMMs on the GPU may use TF32 tensor cores (inputs rounded to 10-bit "
             "mantissas, f32 sums; as PyTorch's convolutions); no effect on the CPU",
             on_off(o.tf32), {"on", "off"}, [&o](const std::string& v) { o.tf32 = parse_on_off(v, "--tf32"); });
  app.add_flag("--cuda-graph", o.cuda_graph,
               "one rank on a GPU: capture the steady training step (forward, backward, optimizer) as a CUDA graph "
               "after two steps run op by op, and replay it (one launch a step; the same bits); not with --profile, "
               "fp16, --clip-grad-norm, --zero, --sync-bn, --compression or --pipeline-stages");
  app.add_flag("--recompute", o.recompute,
               "activation recompute: every block but the last (a ResNet's stem and residual blocks, a Sequential's "
               "children) keeps only its input, and its backward runs its forward again (less memory for one more "
               "forward; the same training, bit for bit)");
  add_number(app, "--threads", o.threads,
             "CPU threads per rank (0: cores / local ranks; more than 16 per core available is refused)", 0, 1024);
  add_number(app, "--loader-threads", o.loader_threads, "loader threads per rank (0: automatic)", 0, 1024);
  add_number(app, "--loader-nice", o.loader_nice,
             "loader threads run this much lower in priority than the compute threads, so a busy step keeps its "
             "cores (0: the same priority)",
             0, 19);
  app.add_flag("--allow-shared-gpu", o.allow_shared_gpu,
               "when no free GPU is left, take one that another job uses (or that another rank of this job has)");
  add_number_list(app, "--gpus", o.gpus,
                  "the GPUs this job may take, as CUDA numbers them (0,2); default: any free one",
                  NumberRange<int>{0, 1023});
  add_number(app, "--wait-for-gpu", o.wait_for_gpu,
             "minutes to wait for a free GPU (no other job's process on it) before giving up naming who holds them",
             0.0, 1e7);
}

void add_parallel_flags(CLI::App& app, TrainerOptions& o) {
  add_choice(app, "--backend",
             "auto (nccl on GPU; on CPU hierarchical across nodes of several ranks each, else ring), nccl, ring, "
             "hierarchical or mpi",
             o.backend ? comm::backend_name(*o.backend) : "auto", {"auto", "nccl", "ring", "hierarchical", "mpi"},
             [&o](const std::string& v) {
               o.backend = v == "auto" ? std::nullopt : std::optional<comm::Backend>(comm::parse_backend(v));
             });
  add_positive(app, "--bucket-mb", o.bucket_mb, "gradient bucket size", 1e6);
  add_choice(app, "--compression", "gradients on the wire: none, bf16 or fp16 (half the traffic)", "none",
             {"none", "bf16", "fp16"}, [&o](const std::string& v) { o.compression = comm::parse_compression(v); });
  app.add_flag("--sync-bn", o.sync_bn, "synchronise BatchNorm statistics across ranks");
  add_number(app, "--zero", o.zero,
             "ZeRO stage: 1 keeps 1/N of the optimizer state on each rank (bitwise the same training)", 0, 1);
  add_number(app, "--pipeline-stages", o.pipeline_stages,
             "split the model into this many consecutive stages on consecutive ranks (world = stages x "
             "replicas); --accum-steps is the micro-batches in flight",
             1, 1024);
  add_number_list(app, "--pipeline-split", o.pipeline_split,
                  "each stage's first block, e.g. 0,9,18 (default: balanced on measured block costs)",
                  NumberRange<int>{0, 1 << 20});
  add_choice(app, "--pipeline-schedule", "1f1b (fewer activations held) or gpipe", name_of(o.pipeline_schedule),
             {"1f1b", "gpipe"}, [&o](const std::string& v) { o.pipeline_schedule = parse_pipeline_schedule(v); });
  add_choice(app, "--pipeline-balance", "balance the stages' measured time, or their memory",
             name_of(o.pipeline_balance), {"time", "memory"},
             [&o](const std::string& v) { o.pipeline_balance = parse_pipeline_balance(v); });
  app.add_flag("--pipeline-recompute", o.pipeline_recompute,
               "stages keep only each micro-batch's input and, in backward, run the forward again block by block: "
               "one block's activations held instead of up to --pipeline-stages micro-batches' (the same training, "
               "bit for bit, for two more forwards)");
  add_choice(app, "--layout",
             "auto: measure the model and the links, then choose replicas x pipeline stages, micro-batch and "
             "accumulation, --zero, recompute, --backend and --bucket-mb for the global batch (the fastest layout "
             "predicted to fit --max-memory); given: the flags as given",
             o.layout_auto ? "auto" : "given", {"given", "auto"},
             [&o](const std::string& v) { o.layout_auto = v == "auto"; });
  app.add_option(
      "--link-calibration", o.link_calibration,
      "with --layout auto: the link model from this file (ringtrain_plan --save-link) instead of measuring it");
}

void add_output_flags(CLI::App& app, TrainerOptions& o) {
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "write checkpoints here (always one at the end)");
  add_number(app, "--checkpoint-every", o.checkpoint_every,
             "optimizer steps between checkpoints (0: end of every epoch)", 0, int64_t{1} << 40);
  add_number(app, "--checkpoint-every-min", o.checkpoint_every_min,
             "also write one when this many minutes passed since the last (0: off); bounds the work a failure loses",
             0.0, 1e7);
  add_number(app, "--keep-last", o.keep_last, "checkpoints kept in --checkpoint-dir, older ones deleted (0: all)", 0,
             int64_t{1} << 20);
  app.add_option("--resume", o.resume, "auto (newest in --checkpoint-dir, if any) or a checkpoint path");
  app.add_flag("--allow-batch-change", o.allow_batch_change,
               "resume a checkpoint written at another global batch (the training changes; refused otherwise)");
  app.add_flag("--strict", o.strict,
               "refuse data records that decode only with libjpeg warnings (corrupt data) instead of counting them");
  app.add_flag("--start-over", o.start_over,
               "start a new run in a --checkpoint-dir that holds another run's checkpoints, moving them into a "
               "set-aside-<date> folder of it first (refused otherwise)");
  add_number(app, "--eval-every", o.eval_every, "epochs between evaluations", 1, 1000000);
  add_number(app, "--log-every", o.log_every, "steps between progress lines / JSONL records", 1, int64_t{1} << 40);
  add_choice(app, "--progress", "auto (a bar on a terminal when not under mpirun, else lines), bar or lines",
             name_of(o.progress), {"auto", "bar", "lines"},
             [&o](const std::string& v) { o.progress = parse_progress(v); });
  app.add_option("--log-jsonl", o.log_jsonl, "append one JSON object per log interval, eval and a summary");
  app.add_option("--trace", o.trace, "write a Chrome/Perfetto trace merged across ranks");
  add_number(app, "--trace-steps", o.trace_steps, "steps the trace covers (from the first)", 1, int64_t{1} << 40);
  app.add_flag_callback(
      "--profile", [&o] { o.profile_steps = o.profile_steps > 0 ? o.profile_steps : kProfileDefaultSteps; },
      detail::str_cat("after ", kProfileWarmupSteps,
                      " warm-up steps, time every op of --profile-steps steps: a table per op family (GPU time from "
                      "CUDA events, host time, share of the step, host waits per step), printed and written as a "
                      "JSONL profile record"));
  add_number(app, "--profile-steps", o.profile_steps, "steps --profile measures (giving it turns --profile on)", 1,
             int64_t{1} << 20);
  app.add_flag_callback(
      "--profile-layers",
      [&o] {
        o.profile_layers = true;
        o.profile_steps = o.profile_steps > 0 ? o.profile_steps : kProfileDefaultSteps;
      },
      "--profile per layer too: each op under the module that ran it (its backward under the module that "
      "recorded it); prints the largest rows, the JSONL record has all");
  app.add_flag("--check", o.check, "run the preflight doctor (ringtrain_env) first");
  add_number(app, "--timeout", o.timeout,
             "seconds a step phase or collective may take before the job is aborted (0: off)", 0.0, 1e9);
}

}  // namespace

nlohmann::json flag_values(const CLI::App& app) {
  nlohmann::json out = nlohmann::json::object();
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty() || opt->get_lnames()[0] == "help") continue;
    std::string key = opt->get_lnames()[0];
    std::replace(key.begin(), key.end(), '-', '_');
    if (opt->get_expected_min() == 0) {  // a flag: given or not
      out[key] = opt->count() > 0 ? "on" : "off";
      continue;
    }
    std::string value;
    for (const std::string& r : opt->results()) value += (value.empty() ? "" : ",") + r;
    out[key] = opt->count() > 0 ? value : opt->get_default_str();
  }
  return out;
}

void add_trainer_flags(CLI::App& app, TrainerOptions& options, std::string& data_dir) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->always_capture_default();
  add_length_flags(app, options, data_dir);
  add_optimisation_flags(app, options);
  add_device_flags(app, options);
  add_parallel_flags(app, options);
  add_output_flags(app, options);
  // Every flag of the app (its own too, added after this call) is recorded once parsing is done, so a
  // checkpoint knows the run's whole command line and a resume that changes any of it is said.
  app.parse_complete_callback([&app, &options, &data_dir] {
    options.flags = flag_values(app);
    options.read_folders.clear();  // what no output may lie in (check_outputs)
    if (!data_dir.empty()) options.read_folders.emplace_back("--data", data_dir);
    options.given.clear();
    for (const CLI::Option* opt : app.get_options())
      if (opt->count() > 0 && !opt->get_lnames().empty()) options.given.insert("--" + opt->get_lnames()[0]);
  });
}

CLI::Option* add_bytes(CLI::App& app, const std::string& names, int64_t& target, const std::string& help, int64_t min) {
  return app
      .add_option_function<std::string>(
          names, [&target](const std::string& v) { target = parse_bytes("size", v); }, help)
      ->type_name("SIZE")
      ->check(CLI::Validator(
          [min](std::string& v) {
            int64_t bytes = 0;
            const std::string problem = bytes_problem(v, bytes);
            if (!problem.empty() || bytes >= min) return problem;
            return detail::str_cat("expected at least ", format_bytes(min), ", got '", v, "' (", bytes, " bytes)");
          },
          ""));
}

std::optional<int> parse_flags(CLI::App& app, int argc, const char* const* argv) {
  const std::string program = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "ringtrain";
  // The environment is input too: every RINGTRAIN_* variable set is checked first, by every program (--help
  // included), whether or not this run reaches the code that reads it (docs/ENVIRONMENT.md).
  try {
    for (const std::string& w : check_environment())
      std::fprintf(stderr, "%s: warning: %s\n", program.c_str(), w.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {  // a flag's callback refused its value
    std::fprintf(stderr, "%s: %s\nRun with --help for more information.\n", program.c_str(), e.what());
    return 2;
  }
  return std::nullopt;
}

const char* const kTrainerMemoryHint =
    "a smaller -b (with --accum-steps to keep the global batch), --precision bf16, --recompute, --zero 1, or fewer "
    "--loader-threads; --max-memory refuses a run the memory plan says will not fit before its first step";

int main_error(const char* program, const char* memory_hint) noexcept {
  auto hint = [&](bool oom) {
    if (oom && memory_hint) std::fprintf(stderr, "%s: to use less memory: %s\n", program, memory_hint);
  };
  try {
    throw;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: error: out of host memory (an allocation failed)\n", program);
    hint(true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    hint(out_of_memory_message(e.what()));
  } catch (...) {
    std::fprintf(stderr, "%s: error: an unknown exception (not derived from std::exception)\n", program);
  }
  return 1;
}

}  // namespace ringtrain::runtime
