// apps/train_resnet: data-parallel ResNet training, what users run:
//   mpirun -np 8 ./train_resnet --data /shards/cifar10 -a resnet56 -b 128 --epochs 90 --checkpoint-dir ckpt
// `--help` lists every flag with its default. Each rank holds a full replica; GradSync averages the
// gradients (ring all-reduce on CPU, NCCL on GPU) during backward; the sampler gives each rank a disjoint
// slice of every global batch. Rank 0 prints progress, evaluation and a summary, and writes checkpoints,
// the JSONL log and the merged Chrome trace. An error on any rank prints "rank R (host): reason" once
// and ends the whole job (comm::run_main); a step or collective stuck past --timeout is reported with
// the phase it is stuck in, then the job is aborted.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "comm/grad_sync.h"
#include "comm/sync_batchnorm.h"
#include "comm/world.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/autocast.h"
#include "core/checkpoint.h"
#include "core/gpu_monitor.h"
#include "core/ops.h"
#include "core/optim/grad_scaler.h"
#include "core/optim/optimizer.h"
#include "core/parallel.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/shards.h"
#include "layers/loss.h"
#include "layers/models/resnet.h"

using namespace ringtrain;
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  std::string data, arch = "resnet20", lr_schedule = "cosine", lr_scaling = "none", optimizer = "sgd";
  std::string device = "auto", precision = "fp32", backend = "auto", checkpoint_dir, resume, log_jsonl, trace;
  std::string milestones, progress = "auto", compression = "none";
  bool synthetic = false, nesterov = false, sync_bn = false, check = false, hflip = true;
  int64_t batch = 128, epochs = 1, steps = 0, accum = 1, checkpoint_every = 0, eval_every = 1, log_every = 50;
  int64_t trace_steps = 100;
  bool allow_shared_gpu = false;
  int64_t synthetic_size = 2048, image_size = 0, pad_crop = -1, seed = 0;
  double lr = 0.1, momentum = 0.9, wd = 5e-4, warmup_epochs = 0, label_smoothing = 0, bucket_mb = 25,
         timeout = 1800, lr_gamma = 0.1, step_epochs = 30;
  int threads = 0, loader_threads = 0;

  json to_json() const {
    return {{"data", data},           {"synthetic", synthetic}, {"arch", arch},
            {"batch_size", batch},    {"epochs", epochs},       {"steps", steps},
            {"lr", lr},               {"momentum", momentum},   {"wd", wd},
            {"nesterov", nesterov},   {"warmup_epochs", warmup_epochs}, {"lr_schedule", lr_schedule},
            {"lr_scaling", lr_scaling}, {"label_smoothing", label_smoothing}, {"optimizer", optimizer},
            {"device", device},       {"precision", precision}, {"accum_steps", accum},
            {"sync_bn", sync_bn},     {"seed", seed},           {"backend", backend},
            {"bucket_mb", bucket_mb}, {"pad_crop", pad_crop},   {"hflip", hflip},
            {"compression", compression}};
  }
};

// ---------------------------------------------------------------------------------------------------
// The watchdog: the main thread names the phase it is in; a step or collective stuck in one phase
// longer than --timeout is reported (rank, step, phase, seconds) and the job is aborted.

class Watchdog {
 public:
  Watchdog(const comm::World& world, double timeout_s) : world_(world), timeout_s_(timeout_s) {
    if (timeout_s_ > 0) thread_ = std::thread([this] { run(); });
  }
  ~Watchdog() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void phase(const char* name, int64_t step) {
    if (std::getenv("RT_DEBUG_PHASES")) std::fprintf(stderr, "[rank %d] step %lld: %s\n", world_.rank(), static_cast<long long>(step), name);
    phase_.store(name);
    step_.store(step);
    since_.store(Clock::now().time_since_epoch().count());
  }

 private:
  void run() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const auto since = Clock::time_point(Clock::duration(since_.load()));
      const double stuck = std::chrono::duration<double>(Clock::now() - since).count();
      if (stuck > timeout_s_) {
        const std::string phase = phase_.load();
        const bool waiting = phase.find("waiting") != std::string::npos;
        world_.abort(detail::str_cat("step ", step_.load(), " stuck in ", phase, " for ", static_cast<int64_t>(stuck),
                                     " s (--timeout ", timeout_s_, ")",
                                     waiting ? ": this rank is waiting for others, so some other rank is behind"
                                             : ": this rank is the one behind"));
      }
    }
  }
  const comm::World& world_;
  double timeout_s_;
  std::atomic<const char*> phase_{"startup"};
  std::atomic<int64_t> step_{0};
  std::atomic<Clock::rep> since_{Clock::now().time_since_epoch().count()};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------------------
// Chrome trace: complete ("X") events per rank, merged on rank 0 (one process per rank).

class Trace {
 public:
  Trace(bool on, int64_t max_steps) : on_(on), max_steps_(max_steps), origin_(Clock::now()) {}
  // tid 0: the training thread; tid 1: the communication thread (bucket all-reduces).
  void span(const std::string& name, Clock::time_point begin, Clock::time_point end, int64_t step, int tid = 0) {
    if (!on_ || step >= max_steps_) return;
    events_.push_back({{"name", name}, {"ph", "X"}, {"tid", tid},
                       {"ts", std::chrono::duration<double, std::micro>(begin - origin_).count()},
                       {"dur", std::chrono::duration<double, std::micro>(end - begin).count()},
                       {"args", {{"step", step}}}});
  }
  void write(const comm::World& world, const std::string& path) {
    if (!on_) return;
    for (auto& e : events_) e["pid"] = world.rank();
    const std::vector<std::string> all = comm::gather_strings(world.comm(), events_.dump());
    if (!world.is_root()) return;
    json merged = json::array();
    for (int r = 0; r < world.size(); ++r) {
      merged.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r) + " (" + world.hosts()[r] + ")"}}}});
      for (auto& e : json::parse(all[r])) merged.push_back(e);
    }
    std::ofstream out(path);
    RT_CHECK(out.good(), "--trace: cannot write '", path, "'");
    out << json{{"traceEvents", merged}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  }

 private:
  bool on_;
  int64_t max_steps_;
  Clock::time_point origin_;
  json events_ = json::array();
};

// --trace covers the first --trace-steps steps of the run (a trace of every step of a long run would be
// gigabytes).
int64_t first_trace_step_limit(const Config& cfg) { return cfg.trace_steps; }

// ---------------------------------------------------------------------------------------------------
// Data: shard folders through the threaded loader, or synthetic batches drawn from (seed, epoch, index).

struct Source {
  std::optional<data::ShardDataset> train, test;
  std::unique_ptr<data::Loader> train_loader, test_loader;
  int64_t height = 32, width = 32, channels = 3, classes = 10, train_size = 0;
};

// Drawn on `device` itself: on a GPU a host-made batch would put a CPU fill and a pageable copy of the
// whole batch inside every timed step, which a benchmark must not measure.
Tensor synthetic_images(int64_t batch, const Source& s, uint64_t seed, int64_t epoch, int64_t index, int rank,
                        Device device) {
  return Tensor::normal(Shape{batch, s.height, s.width, s.channels}, 0, 1,
                        seed * 1000003u + static_cast<uint64_t>(epoch) * 7919u + static_cast<uint64_t>(index) * 131u +
                            static_cast<uint64_t>(rank),
                        DType::F32, device);
}

// ---------------------------------------------------------------------------------------------------

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

std::vector<double> parse_doubles(const std::string& flag, const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      size_t used = 0;
      out.push_back(std::stod(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      RT_THROW(flag, ": expected comma-separated numbers, got '", text, "'");
    }
  }
  return out;
}

fs::path checkpoint_path(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-step%08lld.h5", static_cast<long long>(step));
  return fs::path(dir) / name;
}

fs::path newest_checkpoint(const std::string& dir) {
  fs::path best;
  int64_t best_step = -1;
  if (dir.empty() || !fs::is_directory(dir)) return best;
  // Names are ckpt-step<digits>.h5 (no <regex>: GCC 12 warns inside it under the sanitizers).
  const std::string prefix = "ckpt-step", suffix = ".h5";
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const int64_t s = std::stoll(digits);
    if (s > best_step) {
      best_step = s;
      best = entry.path();
    }
  }
  return best;
}

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

struct EvalResult {
  double top1 = 0, top5 = 0, loss = 0;
  int64_t count = 0;
};

// Exact over the whole test split: every sample once across ranks, padding masked, sums all-reduced.
EvalResult evaluate(ResNet& model, Source& src, const comm::World& world, int64_t batch, double label_smoothing,
                    Watchdog& dog, int64_t step) {
  EvalResult r;
  if (!src.test) return r;
  model.eval();
  NoGradGuard no_grad;
  src.test_loader->start(data::eval_batches(src.test->size(), world.rank(), world.size(), batch), 0);
  double sums[4] = {0, 0, 0, 0};  // top1, top5, loss, count
  CrossEntropyLoss loss_fn(label_smoothing);
  while (auto b = src.test_loader->next()) {
    dog.phase("evaluation", step);
    if (b->valid == 0) continue;
    Tensor images = b->images.slice(0, b->valid), labels = b->labels.slice(0, b->valid);
    Tensor logits = model(images);
    sums[2] += loss_fn(logits, labels).item() * static_cast<double>(b->valid);
    Tensor host = logits.to(Device::cpu()).to(DType::F32);
    Tensor lab = labels.to(Device::cpu()).to(DType::I64);
    const int64_t classes = host.size(1);
    for (int64_t i = 0; i < b->valid; ++i) {
      const float* row = host.data<float>() + i * classes;
      const int64_t label = lab.data<int64_t>()[i];
      const float target = row[label];
      // Rank of the true class: classes scoring higher, ties broken by index; a non-finite score is wrong.
      int64_t above = std::isfinite(target) ? 0 : classes;
      for (int64_t c = 0; c < classes && above < classes; ++c)
        above += (row[c] > target || (row[c] == target && c < label) || std::isnan(row[c])) ? 1 : 0;
      sums[0] += above == 0 ? 1 : 0;
      sums[1] += above < 5 ? 1 : 0;
    }
    sums[3] += static_cast<double>(b->valid);
  }
  dog.phase("evaluation all-reduce (waiting for other ranks)", step);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums, 4, MPI_DOUBLE, MPI_SUM, world.comm()));
  model.train();
  r.count = static_cast<int64_t>(sums[3]);
  if (r.count > 0) {
    r.top1 = sums[0] / sums[3];
    r.top5 = sums[1] / sums[3];
    r.loss = sums[2] / sums[3];
  }
  return r;
}

// Every step: the ranks confirm they agree on the step number and bucket plan (one tiny all-reduce);
// a mismatch names the ranks that differ from rank 0.
void check_in_step(const comm::World& world, int64_t step, uint64_t plan) {
  int64_t v[4] = {step, -step, static_cast<int64_t>(plan >> 1), -static_cast<int64_t>(plan >> 1)};
  int64_t m[4];
  MPI_CHECK(MPI_Allreduce(v, m, 4, MPI_INT64_T, MPI_MIN, world.comm()));
  if (m[0] == step && -m[1] == step && m[2] == v[2] && -m[3] == v[2]) return;
  std::vector<int64_t> all(static_cast<size_t>(2 * world.size()));
  int64_t mine[2] = {step, v[2]};
  MPI_CHECK(MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, world.comm()));
  std::string bad;
  for (int r = 1; r < world.size(); ++r)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      bad += detail::str_cat(bad.empty() ? "" : ", ", "rank ", r, " at step ", all[2 * r],
                             all[2 * r + 1] != all[1] ? " with a different bucket plan" : "");
  throw comm::CollectiveError(detail::str_cat("ranks are out of step: rank 0 is at step ", all[0], ", ", bad));
}

// --check: the quick version of ringtrain_env's doctor, in-process: same build on every rank, and a
// checked, timed all-reduce on the chosen backend. Shards are validated when they are opened anyway.
void preflight(const comm::World& world, const std::string& backend, Device device) {
  const std::string build = detail::str_cat("ringtrain ", __DATE__, " ", __TIME__, " cuda=", RINGTRAIN_WITH_CUDA);
  uint64_t h = 1469598103934665603ull;
  for (char ch : build) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  uint64_t lo = 0, hi = 0;
  MPI_CHECK(MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, world.comm()));
  MPI_CHECK(MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, world.comm()));
  comm::agree_or_throw(world.comm(), lo == hi ? "" : "ranks run different ringtrain builds (this one: " + build + ")",
                       "preflight: same build");
  auto comm = comm::make_communicator(comm::parse_backend(backend), world.comm());
  const int64_t count = 4 << 20;
  Tensor t = Tensor::full(Shape{count}, world.rank() + 1.0, DType::F32, device);
  comm->all_reduce(t);
  const auto t0 = Clock::now();
  comm->all_reduce(t);
  synchronize(device);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double n = world.size(), expect = n * n * (n + 1) / 2;  // two sums of (rank + 1)
  const double got = t.to(Device::cpu()).data<float>()[count - 1];
  comm::agree_or_throw(world.comm(), got == expect ? "" : detail::str_cat("all-reduce gave ", got, ", expected ", expect),
                       "preflight: all-reduce");
  if (world.is_root())
    std::printf("preflight: PASS same build on %d rank(s); PASS %s all-reduce of 16 MiB correct, busbw %.2f GB/s\n",
                world.size(), backend.c_str(), 16.0 * 1024 * 1024 / s / 1e9 * 2.0 * (world.size() - 1) / world.size());
}

// Fault injection for the tests (RINGTRAIN_INJECT=KIND:RANK:STEP, KIND = throw | desync | hang): the
// only way to exercise the job-wide failure paths of a real run deterministically.
struct Injection {
  std::string kind;
  int rank = -1;
  int64_t step = -1;
};
Injection injection_from_env() {
  Injection in;
  const char* text = std::getenv("RINGTRAIN_INJECT");
  if (!text) return in;
  const std::string s = text;
  const size_t a = s.find(':'), b = s.find(':', a == std::string::npos ? a : a + 1);
  RT_CHECK(a != std::string::npos && b != std::string::npos, "RINGTRAIN_INJECT: expected KIND:RANK:STEP, got '", s, "'");
  in.kind = s.substr(0, a);
  in.rank = std::stoi(s.substr(a + 1, b - a - 1));
  in.step = std::stoll(s.substr(b + 1));
  RT_CHECK(in.kind == "throw" || in.kind == "desync" || in.kind == "hang", "RINGTRAIN_INJECT: unknown kind '", in.kind, "'");
  return in;
}

int train(comm::World& world, Config cfg) {
  const Injection inject = injection_from_env();
  // ---- validation that needs no data
  RT_CHECK(cfg.synthetic != !cfg.data.empty(), "give exactly one of --data DIR or --synthetic");
  // Mixed precision: convolutions and GEMMs autocast to bf16/f16 with f32 master weights; f16 adds
  // dynamic loss scaling.
  const std::optional<DType> autocast = cfg.precision == "bf16"   ? std::optional<DType>(DType::BF16)
                                        : cfg.precision == "fp16" ? std::optional<DType>(DType::F16)
                                                                  : std::nullopt;
  Device device = Device::cpu();
  if (cfg.device == "cuda" || (cfg.device == "auto" && cuda_available())) device = Device::cuda(0);
  else if (cfg.device != "cpu" && cfg.device != "auto") RT_THROW("--device must be auto, cpu or cuda, got '", cfg.device, "'");
  const comm::DeviceBinding binding = world.bind(device, cfg.threads, cfg.allow_shared_gpu);
  device = binding.device;
  Watchdog dog(world, cfg.timeout);  // first, so that it also guards the destructors of what follows
  std::string backend = cfg.backend;
  if (backend == "auto") backend = device.is_cuda() ? "nccl" : "ring";
  const bool root = world.is_root();
  if (cfg.check) preflight(world, backend, device);

  // ---- data
  Source src;
  data::LoaderOptions lo;
  lo.threads = cfg.loader_threads;
  lo.seed = static_cast<uint64_t>(cfg.seed);
  lo.device = device;
  if (!cfg.synthetic) {
    RT_CHECK(fs::is_directory(cfg.data), "--data: dataset folder '", cfg.data, "' does not exist");
    src.train.emplace(data::ShardDataset::open(cfg.data, "train"));
    const auto& info = src.train->info();
    src.height = info.height;
    src.width = info.width;
    src.channels = info.channels;
    src.classes = info.num_classes;
    src.train_size = src.train->size();
    bool has_test = false;
    for (const auto& split : data::read_manifest(cfg.data)) has_test |= split.split == "test";
    if (has_test) src.test.emplace(data::ShardDataset::open(cfg.data, "test"));
    const bool small = info.height <= 64;
    lo.transform.train = true;
    lo.transform.pad_crop = cfg.pad_crop >= 0 ? cfg.pad_crop : (small ? 4 : 0);
    lo.transform.resized_crop = small ? 0 : (cfg.image_size > 0 ? cfg.image_size : 224);
    lo.transform.hflip = cfg.hflip;
    src.train_loader = std::make_unique<data::Loader>(*src.train, lo);
    if (src.test) {
      data::LoaderOptions eo = lo;
      eo.transform.train = false;
      src.test_loader = std::make_unique<data::Loader>(*src.test, eo);
    }
  } else {
    const bool cifar = cfg.arch == "resnet20" || cfg.arch == "resnet32" || cfg.arch == "resnet44" ||
                       cfg.arch == "resnet56" || cfg.arch == "resnet110";
    src.height = src.width = cfg.image_size > 0 ? cfg.image_size : (cifar ? 32 : 224);
    src.classes = cifar ? 10 : 1000;
    src.train_size = cfg.synthetic_size;
  }

  // ---- model, optimizer, schedule
  manual_seed(static_cast<uint64_t>(cfg.seed));
  ResNet model(cfg.arch, {.in_channels = src.channels, .num_classes = src.classes});
  model.to(device);

  const int64_t per_step_global = cfg.batch * world.size();
  const int64_t global_batch = per_step_global * cfg.accum;
  data::SamplerOptions so;
  so.dataset_size = src.train_size;
  so.global_batch = per_step_global;
  so.rank = world.rank();
  so.world_size = world.size();
  so.seed = static_cast<uint64_t>(cfg.seed);
  if (src.train) so.chunk = src.train->chunk_records();
  data::DistributedSampler sampler(so);
  const int64_t micro_per_epoch = sampler.batches_per_epoch();
  const int64_t steps_per_epoch = micro_per_epoch / cfg.accum;
  RT_CHECK(steps_per_epoch > 0, "--batch-size ", cfg.batch, " x ", world.size(), " ranks x --accum-steps ", cfg.accum,
           " = global batch ", global_batch, " is larger than the training split (", src.train_size, " records)");
  const int64_t total_steps = cfg.steps > 0 ? cfg.steps : steps_per_epoch * cfg.epochs;
  const int64_t epochs = cfg.steps > 0 ? (total_steps + steps_per_epoch - 1) / steps_per_epoch : cfg.epochs;

  double lr = cfg.lr;
  if (cfg.lr_scaling == "linear") lr *= static_cast<double>(global_batch) / 256.0;
  LrScheduleOptions lso;
  lso.base_lr = lr;
  lso.total_steps = total_steps;
  lso.warmup_steps = static_cast<int64_t>(cfg.warmup_epochs * static_cast<double>(steps_per_epoch));
  lso.gamma = cfg.lr_gamma;
  if (cfg.lr_schedule == "cosine") lso.shape = LrShape::Cosine;
  else if (cfg.lr_schedule == "step") {
    lso.shape = LrShape::Step;
    lso.step_size = std::max<int64_t>(1, static_cast<int64_t>(cfg.step_epochs * static_cast<double>(steps_per_epoch)));
  } else {
    lso.shape = LrShape::MultiStep;
    std::vector<double> m = cfg.milestones.empty() ? std::vector<double>{0.5 * static_cast<double>(epochs), 0.75 * static_cast<double>(epochs)}
                                                   : parse_doubles("--lr-milestones", cfg.milestones);
    for (double e : m) lso.milestones.push_back(static_cast<int64_t>(e * static_cast<double>(steps_per_epoch)));
  }
  RT_CHECK(lso.warmup_steps < total_steps || lso.shape != LrShape::Cosine, "--warmup-epochs ", cfg.warmup_epochs, " (",
           lso.warmup_steps, " steps) must end before the run does (", total_steps, " steps)");
  for (size_t i = 1; i < lso.milestones.size(); ++i)
    RT_CHECK(lso.milestones[i] > lso.milestones[i - 1], "--lr-milestones must be increasing epochs, got '", cfg.milestones, "'");
  LrSchedule schedule(lso);
  std::unique_ptr<Optimizer> opt;
  if (cfg.optimizer == "sgd")
    opt = std::make_unique<Sgd>(as_named(model.named_parameters()),
                                SgdOptions{.momentum = cfg.momentum, .nesterov = cfg.nesterov, .weight_decay = cfg.wd});
  else
    opt = std::make_unique<AdamW>(as_named(model.named_parameters()), AdamWOptions{.weight_decay = cfg.wd});
  CrossEntropyLoss loss_fn(cfg.label_smoothing);
  std::optional<GradScaler> scaler;
  if (cfg.precision == "fp16") scaler.emplace();
  std::vector<Tensor> parameters;
  for (const auto& named : model.named_parameters()) parameters.push_back(named.second);
  if (root && autocast && device.is_cpu())
    std::printf("note: --precision %s on the CPU runs 16-bit convolutions through f32 kernels: correct, not faster\n",
                cfg.precision.c_str());

  // ---- resume: rank 0 picks the checkpoint, every rank loads it (a folder every rank can read), and
  // GradSync below then checks every rank holds the same weights.
  int64_t step = 0;
  data::SamplerState position;
  std::string resume_text;
  if (root) {
    if (cfg.resume == "auto") resume_text = newest_checkpoint(cfg.checkpoint_dir).string();
    else resume_text = cfg.resume;
  }
  {
    int length = static_cast<int>(resume_text.size());
    MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, 0, world.comm()));
    resume_text.resize(static_cast<size_t>(length));
    MPI_CHECK(MPI_Bcast(resume_text.data(), length, MPI_CHAR, 0, world.comm()));
  }
  const fs::path resume_path = resume_text;
  if (!resume_path.empty()) {
    std::string error;
    Checkpoint ck;
    try {
      RT_CHECK(fs::exists(resume_path), "checkpoint '", resume_text, "' does not exist here (every rank must be able ",
               "to read the checkpoint folder)");
      ck = load_checkpoint(resume_path);
    } catch (const std::exception& e) {
      error = e.what();
    }
    comm::agree_or_throw(world.comm(), error, "--resume");
    const json meta = json::parse(ck.meta_json);
    const int64_t ck_global = meta.at("global_batch").get<int64_t>();
    RT_CHECK(ck_global == global_batch, "--resume ", resume_text, ": the checkpoint was written with global batch ",
             ck_global, " (", meta.at("world_size").get<int>(), " ranks x batch ", meta.at("config").at("batch_size").get<int64_t>(),
             " x accum ", meta.at("config").at("accum_steps").get<int64_t>(), "); resume with the same global batch (now ",
             global_batch, ")");
    model.load_state_dict(ck.model);
    opt->load_state(ck.optimizer);
    if (scaler && meta.contains("loss_scale"))
      scaler->load(meta.at("loss_scale").at("scale").get<double>(), meta.at("loss_scale").at("growth_tracker").get<int64_t>());
    step = meta.at("step").get<int64_t>();
    position.epoch = meta.at("sampler").at("epoch").get<int64_t>();
    // The position counts sampler batches of ranks x batch images; convert when that changed (e.g. more
    // ranks with a smaller per-rank batch and accumulation).
    const int64_t ck_psg = meta.value("per_step_global", per_step_global);
    const int64_t samples = meta.at("sampler").at("next_batch").get<int64_t>() * ck_psg;
    RT_CHECK(samples % per_step_global == 0, "--resume ", resume_text, ": the checkpoint stopped after ", samples,
             " samples of its epoch, not a multiple of this run's ", per_step_global, " (ranks x --batch-size)");
    position.next_batch = samples / per_step_global;
    if (position.next_batch >= steps_per_epoch * cfg.accum) {
      ++position.epoch;
      position.next_batch = 0;
    }
    if (root) std::printf("resumed from %s: step %lld, epoch %lld, batch %lld\n", resume_text.c_str(),
                          static_cast<long long>(step), static_cast<long long>(position.epoch),
                          static_cast<long long>(position.next_batch));
  }

  // ---- data parallelism: rank 0's (possibly resumed) weights everywhere, checked.
  auto comm = comm::make_communicator(comm::parse_backend(backend), world.comm());
  if (cfg.sync_bn) comm::convert_sync_batchnorm(model, comm::make_communicator(comm::parse_backend(backend), world.comm()));
  comm::GradSyncOptions gso;
  gso.bucket_mb = cfg.bucket_mb;
  gso.compression = comm::parse_compression(cfg.compression);
  if (root && gso.compression == comm::Compression::F16 && cfg.precision != "fp16")
    std::fprintf(stderr, "train_resnet: warning: --compression fp16 without --precision fp16 sends unscaled gradients as "
                         "fp16, where values below 6e-8 flush to zero and above 65504 overflow; bf16 keeps fp32's range\n");
  comm::GradSync sync(model, comm, gso);
  uint64_t plan = 1469598103934665603ull;
  for (const auto& b : sync.buckets()) plan = (plan ^ static_cast<uint64_t>(b.numel)) * 1099511628211ull;

  if (root) {
    std::printf("train_resnet: %s on %s, %d rank(s) on %d node(s), %s backend, batch %lld/rank x %lld accum = %lld global, "
                "%lld steps/epoch, %lld steps, lr %.4g (%s)%s\n",
                cfg.arch.c_str(), binding.device.str().c_str(), world.size(), world.num_nodes(), backend.c_str(),
                static_cast<long long>(cfg.batch), static_cast<long long>(cfg.accum), static_cast<long long>(global_batch),
                static_cast<long long>(steps_per_epoch), static_cast<long long>(total_steps), lr, cfg.lr_schedule.c_str(),
                cfg.compression == "none" ? "" : (", gradients travel as " + cfg.compression).c_str());
    std::fflush(stdout);
  }

  std::ofstream jsonl;
  if (root && !cfg.log_jsonl.empty()) {
    jsonl.open(cfg.log_jsonl, std::ios::app);
    RT_CHECK(jsonl.good(), "--log-jsonl: cannot write '", cfg.log_jsonl, "'");
  }
  auto log = [&](const json& j) {
    if (jsonl.is_open()) {
      jsonl << j.dump() << "\n";
      jsonl.flush();
    }
  };
  {  // what scripts/scaling_model.py needs besides the timings: the run's shape and its bucket plan
    json buckets = json::array();
    int64_t params = 0;
    for (const auto& b : sync.buckets()) {
      buckets.push_back({{"bytes", b.bytes}, {"numel", b.numel}, {"parameters", b.parameters.size()}});
      params += b.numel;
    }
    log({{"type", "plan"}, {"world_size", world.size()}, {"nodes", world.num_nodes()}, {"arch", cfg.arch},
         {"batch_size", cfg.batch}, {"accum_steps", cfg.accum}, {"global_batch", global_batch}, {"backend", backend},
         {"device", binding.device.str()}, {"threads", binding.threads}, {"params", params}, {"buckets", buckets}});
  }

  // GPU telemetry (NVML, loaded at run time; skipped when absent): with --log-jsonl on CUDA, one "gpu"
  // record per logged interval holding every rank's reading.
  std::unique_ptr<GpuMonitor> gpu_monitor;
  const bool gpu_samples = device.is_cuda() && !cfg.log_jsonl.empty();
  if (gpu_samples) {
    const auto& infos = cuda_status().devices;
    const auto at = static_cast<size_t>(device.index);
    gpu_monitor = std::make_unique<GpuMonitor>(at < infos.size() ? infos[at].pci_bus_id : "", device.index);
    if (root && !gpu_monitor->available()) std::printf("GPU telemetry off: %s\n", gpu_monitor->reason().c_str());
  }
  auto log_gpu = [&](int64_t at_step) {
    double mine[6] = {0, 0, 0, 0, 0, 0};  // valid, utilisation, memory used, memory total, temperature, power
    if (gpu_monitor) {
      if (auto g = gpu_monitor->sample()) {
        const double values[6] = {1, g->util_pct, g->mem_used_bytes, g->mem_total_bytes, g->temperature_c, g->power_w};
        std::copy(std::begin(values), std::end(values), mine);
      }
    }
    std::vector<double> all(root ? 6 * static_cast<size_t>(world.size()) : 0);
    MPI_CHECK(MPI_Gather(mine, 6, MPI_DOUBLE, all.data(), 6, MPI_DOUBLE, 0, world.comm()));
    if (!root) return;
    json samples = json::array();
    for (int r = 0; r < world.size(); ++r) {
      const double* v = all.data() + 6 * static_cast<size_t>(r);
      if (v[0] <= 0) continue;
      json one{{"rank", r}};
      const char* names[5] = {"util_pct", "mem_used_bytes", "mem_total_bytes", "temperature_c", "power_w"};
      for (int f = 0; f < 5; ++f)
        if (std::isfinite(v[f + 1])) one[names[f]] = v[f + 1];  // a field the board cannot report is left out
      samples.push_back(one);
    }
    if (!samples.empty()) log({{"type", "gpu"}, {"step", at_step}, {"samples", samples}});
  };

  Trace trace(!cfg.trace.empty(), first_trace_step_limit(cfg));
  // A redrawn bar on a terminal, plain lines otherwise. Under mpirun rank 0's stdout is a pseudo-terminal
  // even when mpirun's own output goes to a file, so --progress auto uses lines there. Every rank must
  // agree (the bar reports every step, with a collective), so rank 0 decides.
  int bar = cfg.progress == "bar" || (cfg.progress == "auto" && isatty(STDOUT_FILENO) && !std::getenv("OMPI_COMM_WORLD_SIZE"));
  MPI_CHECK(MPI_Bcast(&bar, 1, MPI_INT, 0, world.comm()));
  const bool tty = bar != 0;

  auto save = [&](int64_t at_step, const data::SamplerState& pos) {
    if (cfg.checkpoint_dir.empty()) return;
    dog.phase("checkpoint", at_step);
    // Rank 0's file must describe every rank: BatchNorm running statistics (per rank without SyncBN)
    // are averaged first, so a resumed run (which starts every rank from the file) continues exactly.
    if (!cfg.sync_bn && world.size() > 1) sync.average_buffers();
    if (root) {
      fs::create_directories(cfg.checkpoint_dir);
      json meta{{"step", at_step}, {"epoch", pos.epoch}, {"sampler", {{"epoch", pos.epoch}, {"next_batch", pos.next_batch}}},
                {"world_size", world.size()}, {"global_batch", global_batch}, {"per_step_global", per_step_global},
                {"config", cfg.to_json()},
                {"lr", schedule.at(std::max<int64_t>(0, at_step - 1))}};
      if (scaler) meta["loss_scale"] = {{"scale", scaler->scale()}, {"growth_tracker", scaler->growth_tracker()}};
      save_checkpoint(checkpoint_path(cfg.checkpoint_dir, at_step), Checkpoint{model.state_dict(), opt->state(), meta.dump()});
    }
    MPI_CHECK(MPI_Barrier(world.comm()));
  };

  // ---- the loop
  std::vector<double> step_times;  // every optimizer step's wall time, for the summary's median
  Clock::time_point step_begin;
  // data, forward, backward, exposed comm, optimizer, loss sum, loss weight (finite micro-batch losses
  // only: with f16 loss scaling an overflowing step is skipped, and its loss must not poison the mean)
  double interval[7] = {0, 0, 0, 0, 0, 0, 0};
  // For the summary: the same breakdown summed over every step but the run's first (allocations, caches),
  // and per bucket the time from the last micro-batch's backward start to its launch and its all-reduce.
  double breakdown[5] = {0, 0, 0, 0, 0}, step_breakdown[5] = {0, 0, 0, 0, 0};
  std::vector<double> bucket_ready(sync.buckets().size(), 0.0), bucket_allreduce(sync.buckets().size(), 0.0);
  int64_t breakdown_steps = 0;
  int64_t skipped_steps = 0;  // f16 steps skipped for non-finite gradients
  int64_t interval_steps = 0, images_total = 0;
  double last_loss = 0;
  EvalResult last_eval;
  bool evaluated = false;
  const auto run_start = Clock::now();
  auto interval_start = Clock::now();
  Tensor synthetic_labels;
  if (cfg.synthetic) {
    std::vector<double> y(static_cast<size_t>(cfg.batch));
    for (int64_t i = 0; i < cfg.batch; ++i) y[static_cast<size_t>(i)] = static_cast<double>((i * 7 + world.rank()) % src.classes);
    synthetic_labels = Tensor::from_vector(y, Shape{cfg.batch}, DType::I64, device);
  }

  // An epoch is steps_per_epoch * accum micro-batches: a leftover that cannot fill an optimizer step is
  // not run at all.
  const int64_t micro_limit = steps_per_epoch * cfg.accum;
  bool done = step >= total_steps;
  const int64_t first_step = step;
  data::SamplerState last_position = position;  // where the next step would start: what checkpoints save
  for (int64_t epoch = position.epoch; epoch < epochs && !done; ++epoch) {
    sampler.set_epoch(epoch);
    if (epoch == position.epoch && position.next_batch > 0) sampler.restore(position);
    int64_t micro = sampler.state().next_batch;
    if (src.train_loader) src.train_loader->start_epoch(sampler, epoch);
    int64_t in_accum = 0;
    sync.zero_grad();
    for (;;) {
      const auto t0 = Clock::now();
      if (in_accum == 0) step_begin = t0;
      dog.phase("data loading", step);
      Tensor images, labels;
      if (micro >= micro_limit) break;
      if (src.train_loader) {
        auto batch = src.train_loader->next();
        if (!batch) break;
        images = batch->images;
        labels = batch->labels;
      } else {
        images = synthetic_images(cfg.batch, src, static_cast<uint64_t>(cfg.seed), epoch, micro, world.rank(), device);
        labels = synthetic_labels;
      }
      ++micro;
      const bool last_micro = in_accum + 1 == cfg.accum;
      const auto t1 = Clock::now();
      dog.phase("forward", step);
      Tensor loss;
      {
        AutocastGuard autocast_scope(autocast);
        loss = loss_fn(model(images), labels);
      }
      const double loss_value = loss.item();
      // With f16 loss scaling a non-finite loss makes non-finite gradients: the scaler skips that step.
      if (!std::isfinite(loss_value) && !scaler)
        RT_THROW("non-finite loss (", loss_value, ") at step ", step, " (epoch ", epoch, ", micro-batch ", micro - 1,
                 "): lower --lr, add --warmup-epochs, or check the data");
      const auto t2 = Clock::now();
      dog.phase("backward", step);
      Tensor objective = cfg.accum > 1 ? mul(loss, 1.0 / static_cast<double>(cfg.accum)) : loss;
      if (scaler) objective = scaler->scale_loss(objective);
      if (!last_micro) {
        auto guard = sync.no_sync();
        objective.backward();
      } else {
        objective.backward();
      }
      const auto t3 = Clock::now();
      step_breakdown[0] += std::chrono::duration<double>(t1 - t0).count();
      step_breakdown[1] += std::chrono::duration<double>(t2 - t1).count();
      step_breakdown[2] += std::chrono::duration<double>(t3 - t2).count();
      if (std::isfinite(loss_value)) {
        interval[5] += loss_value / static_cast<double>(cfg.accum);
        interval[6] += 1.0 / static_cast<double>(cfg.accum);
        last_loss = loss_value;
      }
      trace.span("data_wait", t0, t1, step);
      trace.span("forward", t1, t2, step);
      trace.span("backward", t2, t3, step);
      if (!last_micro) {
        ++in_accum;
        continue;
      }
      in_accum = 0;
      dog.phase("gradient all-reduce (waiting for other ranks)", step);
      sync.finish();
      const auto t4 = Clock::now();
      dog.phase("optimizer", step);
      if (scaler) {
        // Gradients are averaged already, so every rank takes the same decision.
        if (!scaler->step(*opt, parameters, schedule.at(step))) {
          ++skipped_steps;
          RT_CHECK(scaler->scale() >= 1e-4, "f16 loss scale fell to ", scaler->scale(), " at step ", step,
                   ": the gradients are not finite at any scale (diverged); lower --lr or use --precision bf16");
        }
      } else {
        opt->step(schedule.at(step));
      }
      sync.zero_grad();
      const auto t_opt = Clock::now();
      ++step;
      if (inject.rank == world.rank() && inject.step == step) {
        if (inject.kind == "throw") RT_THROW("injected failure at step ", step);
        if (inject.kind == "desync") ++step;
        if (inject.kind == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
      }
      dog.phase("step check-in (waiting for other ranks)", step);
      check_in_step(world, step, plan);
      const auto t5 = Clock::now();
      trace.span("exposed_comm", t3, t4, step - 1);
      for (const auto& b : sync.last_bucket_timings())
        trace.span(detail::str_cat("allreduce bucket ", b.bucket), b.begin, b.end, step - 1, 1);
      trace.span("optimizer", t4, t_opt, step - 1);
      trace.span("step check-in", t_opt, t5, step - 1);
      // The check-in waits for the slowest rank: exposed communication, not optimizer time.
      const double exposed = std::chrono::duration<double>(t4 - t3).count() + std::chrono::duration<double>(t5 - t_opt).count();
      const double optimizer = std::chrono::duration<double>(t_opt - t4).count();
      step_breakdown[3] = exposed;
      step_breakdown[4] = optimizer;
      for (int i = 0; i < 5; ++i) interval[i] += step_breakdown[i];  // the logged interval's share
      step_times.push_back(std::chrono::duration<double>(t5 - step_begin).count());
      if (step > first_step + 1 || total_steps - first_step == 1) {
        for (int i = 0; i < 5; ++i) breakdown[i] += step_breakdown[i];
        for (const auto& b : sync.last_bucket_timings()) {
          bucket_ready[static_cast<size_t>(b.bucket)] += std::chrono::duration<double>(b.launched - t2).count();
          bucket_allreduce[static_cast<size_t>(b.bucket)] += std::chrono::duration<double>(b.end - b.begin).count();
        }
        ++breakdown_steps;
      }
      std::fill(std::begin(step_breakdown), std::end(step_breakdown), 0.0);
      ++interval_steps;
      images_total += global_batch;
      last_position = src.train_loader ? src.train_loader->position() : data::SamplerState{epoch, micro};

      const bool finish_now = step >= total_steps;
      if (interval_steps >= cfg.log_every || finish_now || tty) {
        // Loss averaged over ranks for the report.
        double stats[2] = {interval[5], interval[6]};
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, stats, 2, MPI_DOUBLE, MPI_SUM, world.comm()));
        const double mean_loss = stats[0] / stats[1];
        const double seconds = std::chrono::duration<double>(Clock::now() - interval_start).count();
        const double img_s = static_cast<double>(interval_steps * global_batch) / seconds;
        const double eta = static_cast<double>(total_steps - step) * seconds / static_cast<double>(interval_steps);
        if (root) {
          const int64_t in_epoch = (step - 1) % steps_per_epoch + 1;
          if (tty) {  // the bar
            const int width = 24, filled = static_cast<int>(width * in_epoch / steps_per_epoch);
            std::printf("\repoch %lld/%lld [%s%s] %lld/%lld loss %.4f lr %.4g %.0f img/s ETA %s   ",
                        static_cast<long long>(epoch + 1), static_cast<long long>(epochs), std::string(filled, '#').c_str(),
                        std::string(width - filled, '.').c_str(), static_cast<long long>(in_epoch),
                        static_cast<long long>(steps_per_epoch), mean_loss, schedule.at(step - 1), img_s,
                        format_duration(eta).c_str());
          } else {
            std::printf("epoch %lld/%lld step %lld/%lld loss %.4f lr %.4g %.0f img/s ETA %s\n",
                        static_cast<long long>(epoch + 1), static_cast<long long>(epochs), static_cast<long long>(step),
                        static_cast<long long>(total_steps), mean_loss, schedule.at(step - 1), img_s,
                        format_duration(eta).c_str());
          }
          std::fflush(stdout);
          const double n = static_cast<double>(interval_steps);
          log({{"type", "train"}, {"step", step}, {"epoch", epoch}, {"lr", schedule.at(step - 1)}, {"loss", mean_loss},
               {"img_per_s", img_s},
               {"time", {{"data_wait", interval[0] / n}, {"forward", interval[1] / n}, {"backward", interval[2] / n},
                         {"exposed_comm", interval[3] / n}, {"optimizer", interval[4] / n}}}});
        }
        if (gpu_samples) log_gpu(step);
        std::fill(std::begin(interval), std::end(interval), 0.0);
        interval_steps = 0;
        interval_start = Clock::now();
      }
      if (cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0 && !finish_now)
        save(step, last_position);
      if (finish_now) {
        done = true;
        break;
      }
    }
    if (tty && root) std::printf("\n");
    const bool epoch_complete = !done || micro >= micro_limit;
    if (epoch_complete) last_position = data::SamplerState{epoch, micro_limit};
    if ((epoch + 1) % cfg.eval_every == 0 || done || epoch + 1 == epochs) {
      if (src.test) {
        // Without SyncBatchNorm the running statistics differ per rank: evaluate with their average.
        if (!cfg.sync_bn && world.size() > 1) sync.average_buffers();
        last_eval = evaluate(model, src, world, cfg.batch, cfg.label_smoothing, dog, step);
        evaluated = true;
        if (root) {
          std::printf("epoch %lld: test top-1 %.2f%%  top-5 %.2f%%  loss %.4f  (%lld images)\n",
                      static_cast<long long>(epoch + 1), 100 * last_eval.top1, 100 * last_eval.top5, last_eval.loss,
                      static_cast<long long>(last_eval.count));
          std::fflush(stdout);
          log({{"type", "eval"}, {"step", step}, {"epoch", epoch}, {"test_top1", last_eval.top1},
               {"test_top5", last_eval.top5}, {"test_loss", last_eval.loss}, {"images", last_eval.count}});
        }
      }
    }
    if (cfg.checkpoint_every == 0 && epoch_complete && !done) save(step, last_position);
  }
  if (src.train_loader) src.train_loader->stop();
  if (step > first_step) save(step, last_position);  // a finished run relaunched writes nothing new

  // ---- summary
  const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
  std::vector<double> sorted = step_times;
  std::sort(sorted.begin(), sorted.end());
  double peak = peak_rss_bytes();
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_MAX, world.comm()));
  // On a GPU: the caching allocator's high-water mark of memory obtained from the device (what
  // PyTorch's max_memory_reserved reports), the largest over the ranks.
  double peak_gpu = device.is_cuda() ? static_cast<double>(memory_stats(device).peak_reserved_bytes) : 0.0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &peak_gpu, 1, MPI_DOUBLE, MPI_MAX, world.comm()));
  // Every rank's mean breakdown: a synchronous step goes at the pace of the slowest rank, and rank 0's
  // exposed_comm includes waiting for it; the scaling model needs to tell the two apart.
  const double steps_measured = static_cast<double>(std::max<int64_t>(1, breakdown_steps));
  double my_breakdown[5];
  for (int i = 0; i < 5; ++i) my_breakdown[i] = breakdown[i] / steps_measured;
  std::vector<double> all_breakdowns(root ? 5 * static_cast<size_t>(world.size()) : 0);
  MPI_CHECK(MPI_Gather(my_breakdown, 5, MPI_DOUBLE, all_breakdowns.data(), 5, MPI_DOUBLE, 0, world.comm()));
  trace.write(world, cfg.trace);
  if (root) {
    json summary{{"type", "summary"}, {"train_loss", last_loss}, {"img_per_s", static_cast<double>(images_total) / elapsed},
                 {"median_step_s", sorted.empty() ? 0.0 : sorted[sorted.size() / 2]}, {"peak_mem_bytes", peak},
                 {"world_size", world.size()}, {"steps", step}, {"elapsed_s", elapsed}};
    const double n = steps_measured;
    auto parts = [](const double* v) {
      return json{{"data_wait", v[0]}, {"forward", v[1]}, {"backward", v[2]}, {"exposed_comm", v[3]}, {"optimizer", v[4]}};
    };
    summary["breakdown_s"] = parts(my_breakdown);
    json by_rank = json::array();
    for (int r = 0; r < world.size(); ++r) by_rank.push_back(parts(all_breakdowns.data() + 5 * static_cast<size_t>(r)));
    summary["breakdown_by_rank_s"] = by_rank;
    json buckets = json::array();
    for (size_t i = 0; i < bucket_ready.size(); ++i)
      buckets.push_back({{"bytes", sync.buckets()[i].bytes}, {"ready_s", bucket_ready[i] / n}, {"allreduce_s", bucket_allreduce[i] / n}});
    summary["buckets"] = buckets;
    summary["breakdown_steps"] = breakdown_steps;
    summary["precision"] = cfg.precision;
    summary["device"] = device.str();
    if (device.is_cuda()) {
      summary["peak_gpu_mem_bytes"] = peak_gpu;
      summary["cudnn_conv_algorithms"] = cuda_conv_algorithms();  // rank 0's choices, one per pass and shape
    }
    if (scaler) {
      summary["loss_scale"] = scaler->scale();
      summary["skipped_steps"] = skipped_steps;
    }
    if (evaluated) {
      summary["test_top1"] = last_eval.top1;
      summary["test_top5"] = last_eval.top5;
    }
    log(summary);
    std::printf("done: %lld steps in %s, %.0f img/s, final train loss %.4f", static_cast<long long>(step),
                format_duration(elapsed).c_str(), static_cast<double>(images_total) / elapsed, last_loss);
    if (evaluated) std::printf(", test top-1 %.2f%% top-5 %.2f%%", 100 * last_eval.top1, 100 * last_eval.top5);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel ResNet training (run under mpirun for several ranks)"};
  // A flag given twice takes the last value, so wrappers (scripts/demo.sh, the sbatch script) can put
  // their defaults first and let the user's flags override them.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  Config c;
  app.add_option("--data", c.data, "shard folder (make_shards output with train/ and optionally test/ splits)");
  app.add_flag("--synthetic", c.synthetic, "random data shaped for the model instead of --data");
  app.add_option("--synthetic-size", c.synthetic_size, "records per synthetic epoch")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("-a,--arch", c.arch, "resnet20|32|44|56|110 (CIFAR) or resnet18|34|50|101|152")
      ->capture_default_str()
      ->check(CLI::IsMember(resnet_archs()));
  app.add_option("-b,--batch-size", c.batch, "images per rank per micro-batch")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--epochs", c.epochs, "epochs")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--steps", c.steps, "stop after this many optimizer steps (overrides --epochs; 0 = off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--lr", c.lr, "base learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--wd", c.wd, "weight decay")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--nesterov", c.nesterov, "Nesterov momentum");
  app.add_option("--warmup-epochs", c.warmup_epochs, "linear warmup")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--lr-schedule", c.lr_schedule, "cosine, step or multistep")->capture_default_str()
      ->check(CLI::IsMember({"cosine", "step", "multistep"}));
  app.add_option("--lr-step-epochs", c.step_epochs, "step: decay every this many epochs")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--lr-milestones", c.milestones, "multistep: epochs, comma-separated (default 50% and 75% of the run)");
  app.add_option("--lr-gamma", c.lr_gamma, "step/multistep decay factor")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--lr-scaling", c.lr_scaling, "none, or linear: lr x global batch / 256")->capture_default_str()
      ->check(CLI::IsMember({"none", "linear"}));
  app.add_option("--label-smoothing", c.label_smoothing, "cross-entropy label smoothing")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--optimizer", c.optimizer, "sgd or adamw")->capture_default_str()->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--device", c.device, "auto, cpu or cuda")->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--precision", c.precision, "fp32, bf16 or fp16")->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--accum-steps", c.accum, "micro-batches per optimizer step")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--sync-bn", c.sync_bn, "synchronise BatchNorm statistics across ranks");
  app.add_option("--seed", c.seed, "seed for init, shuffling and augmentation")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--threads", c.threads, "CPU threads per rank (0: cores / local ranks)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--loader-threads", c.loader_threads, "loader threads per rank (0: automatic)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backend", c.backend, "auto (nccl on GPU, ring on CPU), nccl, ring or mpi")->capture_default_str()
      ->check(CLI::IsMember({"auto", "nccl", "ring", "mpi"}));
  app.add_option("--bucket-mb", c.bucket_mb, "gradient bucket size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--compression", c.compression, "gradients on the wire: none, bf16 or fp16 (half the traffic)")
      ->capture_default_str()->check(CLI::IsMember({"none", "bf16", "fp16"}));
  app.add_option("--pad-crop", c.pad_crop, "random crop padding (-1: 4 for images up to 64 px, else off)")->capture_default_str();
  app.add_option("--image-size", c.image_size, "random-resized-crop size for large images / synthetic size (0: model default)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("!--no-hflip", c.hflip, "disable random horizontal flips");
  app.add_option("--checkpoint-dir", c.checkpoint_dir, "write checkpoints here (always one at the end)");
  app.add_option("--checkpoint-every", c.checkpoint_every, "optimizer steps between checkpoints (0: end of every epoch)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--resume", c.resume, "auto (newest in --checkpoint-dir, if any) or a checkpoint path");
  app.add_option("--eval-every", c.eval_every, "epochs between evaluations")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--log-every", c.log_every, "steps between progress lines / JSONL records")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--progress", c.progress, "auto (a bar on a terminal when not under mpirun, else lines), bar or lines")
      ->capture_default_str()->check(CLI::IsMember({"auto", "bar", "lines"}));
  app.add_option("--log-jsonl", c.log_jsonl, "append one JSON object per log interval, eval and a summary");
  app.add_option("--trace", c.trace, "write a Chrome/Perfetto trace merged across ranks");
  app.add_option("--trace-steps", c.trace_steps, "steps the trace covers (from the first)")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--allow-shared-gpu", c.allow_shared_gpu, "allow more ranks per node than GPUs (ranks share GPUs)");
  app.add_flag("--check", c.check, "run the preflight doctor (ringtrain_env) first");
  app.add_option("--timeout", c.timeout, "seconds a step phase or collective may take before the job is aborted (0: off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  return comm::run_main(argc, argv, [&](comm::World& world) { return train(world, c); });
}
