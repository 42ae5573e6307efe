// runtime/layout/layout_probe.cpp: the planner's measurements and --layout auto (layout_probe.h).
#include "runtime/layout/layout_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <span>
#include <thread>

#include "comm/host_collectives.h"
#include "comm/mpi_check.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "io/files.h"
#include "io/json_in.h"
#include "layers/loss.h"
#include "layers/model_state.h"
#include "layers/recompute.h"
#include "optim/optimizer.h"
#include "runtime/memory/memory_plan.h"
#include "runtime/memory/plan_memory.h"
#include "runtime/step/measure_block.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

namespace {
double since(Clock::time_point t) { return seconds(Clock::now() - t); }
}  // namespace

int64_t layout_global_batch(const TrainerOptions& o, int world_size) {
  if (o.global_batch > 0) return o.global_batch;
  if (o.batch <= 0)
    RT_THROW_PERMANENT("--layout auto with -b auto: give the global batch to split (--global-batch N, or -b N for N ",
                       "images a rank)");
  return o.batch * world_size * o.accum;
}

std::pair<int64_t, int64_t> probe_batches(int64_t global_batch, int world_size) {
  const int64_t hi = std::max<int64_t>(1, global_batch / std::max(1, world_size));
  const int64_t lo = std::max<int64_t>(1, hi / 4);
  return {lo == hi ? std::max<int64_t>(1, hi / 2) : lo, lo == hi && hi == 1 ? 2 : hi};
}

ComputeProfile measure_compute(const TrainerOptions& o, Device device, Module& model, const DataInfo& info, int64_t b0,
                               int64_t b1, const std::function<bool(bool)>& together_in) {
  const std::function<bool(bool)> together = together_in ? together_in : [](bool failed) { return failed; };
  RT_CHECK(b0 >= 1 && b1 > b0, "the layout probe: micro-batches ", b0, " and ", b1);
  std::vector<Block> blocks = model.blocks();
  if (blocks.empty()) blocks.push_back({"model", {}, [&model](const Tensor& x) { return model.forward(x); }, {}});
  ComputeProfile p;
  p.batch[0] = b0, p.batch[1] = b1;
  p.blocks.resize(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    p.blocks[i].name = blocks[i].name;
    for (const auto& m : blocks[i].modules)
      for (const auto& [n, t] : m->named_parameters())
        if (t.requires_grad()) p.blocks[i].param_bytes += t.nbytes();
    p.blocks[i].recomputable = i + 1 < blocks.size() && blocks.size() > 1;
  }
  if (blocks.size() == 1 && blocks[0].modules.empty())
    for (const auto& [n, t] : model.named_parameters())
      if (t.requires_grad()) p.blocks[0].param_bytes += t.nbytes();
  // The probe trains: BatchNorm statistics, the generator's stream and the gradients go back after it.
  std::optional<ModelStateGuard> untouched(std::in_place, model);
  const CrossEntropyLoss loss_fn(loss_options(o));
  const std::optional<DType> half = autocast_type(o.precision);
  // Per block, every block's forward and then its backward at once: the proportions of the blocks. A whole
  // step (every forward, the loss, every backward in reverse) is slower than their sum, its backwards finding
  // their activations out of the cache (16% at ResNet-56 b64 on the CPU), so whole passes give the scale:
  // each micro-batch's block times are multiplied by whole / sum. Round 0 warms (plans, caches, oneDNN's
  // primitives), round 1 times the blocks (and what each keeps for its backward), the later ones the whole
  // pass (the fastest counts).
  constexpr int kRounds[2] = {5, 4};  // the small batch's passes are short and noisier: 3 whole ones, the large's 2
  std::vector<double> whole[2];
  std::vector<int64_t> kept[2] = {std::vector<int64_t>(blocks.size()), std::vector<int64_t>(blocks.size())};
  auto pass = [&](int round, int k) {
    const int64_t b = p.batch[k];
    // A whole pass draws its input as the synthetic source does, on the rank's own thread (a loader's work
    // on the same cores is of that order or more).
    const auto t0 = Clock::now();
    Tensor x = Tensor::normal(Shape{b, info.height, info.width, info.channels}, 0, 1, 17 + round, DType::F32, device);
    const Tensor labels = probe_labels(info, b, device);
    if (round != 1) {
      Tensor y = x;
      {
        AutocastGuard autocast(half);
        for (const Block& block : blocks) y = block.forward(y);
      }
      loss_fn(y, labels).backward();
      model.zero_grad(true);
      synchronize(device);
      if (round > 1) whole[k].push_back(since(t0));
      return;
    }
    Tensor prev = x;
    for (size_t i = 0; i < blocks.size(); ++i) {
      std::function<void(const Tensor&)> loss_backward;  // the last block's backward starts from the loss
      if (i + 1 == blocks.size()) loss_backward = [&](const Tensor& y) { loss_fn(y, labels).backward(); };
      const BlockMeasure m = measure_block(blocks[i], prev, i > 0, half, device, false, loss_backward);
      kept[k][i] = m.kept_bytes;  // its output and what backward needs
      BlockProfile& bp = p.blocks[i];
      bp.forward[k] = m.forward_s;
      bp.backward[k] = m.backward_s;
      bp.output_bytes_per_image = m.output.nbytes() / b;
      prev = m.output;
    }
    model.zero_grad(true);
  };
  // Every pass starts on all ranks at once (`together`), as a step does: ranks sharing cores contend as in
  // the run. A rank's error stops every rank's probe at the next pass (none waits for it).
  std::exception_ptr failed;
  bool stop = false;
  auto at_once = [&](const std::function<void()>& fn) {
    if (stop || (stop = together(failed != nullptr))) return;
    try {
      fn();
    } catch (...) {
      failed = std::current_exception();
    }
  };
  // One batch size's passes in a row, as a run's micro-batches come: a pass after a larger one's would
  // find the caches and the heap as no step of the run does.
  for (int k = 0; k < 2; ++k)
    for (int round = 0; round < kRounds[k]; ++round) at_once([&] { pass(round, k); });
  // The optimizer's update over copies of the parameters (the run's rule), every rank at once as in a step:
  // the fastest of three after one to warm.
  std::vector<NamedParameter> copies;
  int64_t bytes = 0;
  std::unique_ptr<Optimizer> opt;
  std::vector<double> updates;
  at_once([&] {
    for (const auto& [n, t] : model.named_parameters())
      if (t.requires_grad()) {
        Tensor c = t.detach().clone();
        c.set_requires_grad(true);
        c.set_grad(Tensor::zeros(t.shape(), t.dtype(), device));
        copies.push_back({n, c});
        bytes += t.nbytes();
      }
    if (o.optimizer == OptimizerKind::Sgd)
      opt = std::make_unique<Sgd>(copies,
                                  SgdOptions{.momentum = o.momentum, .nesterov = o.nesterov, .weight_decay = o.wd});
    else
      opt = std::make_unique<AdamW>(copies, AdamWOptions{.weight_decay = o.wd});
  });
  for (int i = 0; i < 4; ++i)
    at_once([&] {
      const auto t0 = Clock::now();
      if (bytes > 0) opt->step(1e-3);
      synchronize(device);
      if (i > 0) updates.push_back(since(t0));
    });
  const bool others = together(failed != nullptr);
  untouched.reset();
  if (failed) std::rethrow_exception(failed);
  RT_CHECK(!others, "the layout probe failed on another rank");
  for (size_t i = 0; i < blocks.size(); ++i)  // per image: the line through both batches, never below zero
    p.blocks[i].activation_bytes_per_image =
        std::max<int64_t>(0, (kept[1][i] - kept[0][i]) / (p.batch[1] - p.batch[0]));
  for (int k = 0; k < 2; ++k) {
    double sum = 0;
    for (const BlockProfile& bp : p.blocks) sum += bp.forward[k] + bp.backward[k];
    // The fastest pass: on a shared machine interference only slows one.
    const double fastest = *std::min_element(whole[k].begin(), whole[k].end());
    const double scale = sum > 0 && fastest > 0 ? fastest / sum : 1;
    for (BlockProfile& bp : p.blocks) bp.forward[k] *= scale, bp.backward[k] *= scale;
    p.scale[k] = scale;
  }
  if (bytes > 0) {
    p.optimizer_seconds_per_byte = *std::min_element(updates.begin(), updates.end()) / static_cast<double>(bytes);
  }
  return p;
}

namespace {

// The machine this rank runs on: the kernel's boot id (network namespaces share it), else the host name.
std::string machine_id(const comm::World& world) {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in >> id && !id.empty()) return id;
  return world.host();
}

// This rank's host among the world's, numbered in rank order.
int host_index(const comm::World& world) {
  std::vector<std::string> seen;
  for (const std::string& h : world.hosts())
    if (std::find(seen.begin(), seen.end(), h) == seen.end()) seen.push_back(h);
  return static_cast<int>(std::find(seen.begin(), seen.end(), world.host()) - seen.begin());
}

// Median seconds of an all-reduce of `bytes` on `comm` (one warm-up, then `reps`).
double time_allreduce(comm::Communicator& c, Device device, int64_t bytes, int reps) {
  Tensor t = Tensor::ones(Shape{bytes / 4}, DType::F32, device);
  std::vector<double> times;
  for (int i = 0; i <= reps; ++i) {
    const auto t0 = Clock::now();
    c.all_reduce_async(t, comm::ReduceOp::Sum)->wait();
    synchronize(device);
    if (i > 0) times.push_back(since(t0));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The link probes' largest all-reduce: up to 16 MiB, past the caches, as the gradient buckets are (25 MiB by
// default); no larger than the model's gradients, which no bucket exceeds: a larger message would leave the
// run buffers it never needs (16 MiB of resident memory at ResNet-56's 3.4 MB). At least 1 MiB, above the
// smallest's 64 KiB.
int64_t link_probe_bytes(int64_t gradient_bytes) {
  return std::clamp<int64_t>((gradient_bytes + 4095) / 4096 * 4096, int64_t{1} << 20, int64_t{16} << 20);
}

std::pair<double, double> fit_group(MPI_Comm group, int n, comm::Backend backend, Device device, int64_t largest) {
  comm::CommunicatorPtr c = comm::make_communicator(backend, group);
  std::vector<std::pair<int64_t, double>> samples;
  std::vector<int64_t> sizes;
  for (int64_t bytes : {int64_t{64} << 10, int64_t{1} << 20, int64_t{4} << 20, int64_t{16} << 20})
    if (bytes < largest) sizes.push_back(bytes);
  sizes.push_back(largest);
  for (int64_t bytes : sizes) {
    const double t = time_allreduce(*c, device, bytes, 3);
    // The slowest member's time is the collective's.
    samples.push_back({bytes, comm::all_reduce(group, t, comm::HostOp::Max)});
  }
  return fit_ring(samples, n);
}

}  // namespace

LinkModel measure_link(comm::World& world, Device device, int64_t gradient_bytes) {
  LinkModel link;
  const int64_t largest = link_probe_bytes(gradient_bytes);
  const comm::Backend backend = device.is_cuda() ? comm::Backend::Nccl : comm::Backend::Ring;
  MPI_Comm local = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(world.comm(), host_index(world), world.rank(), &local));
  double intra[2] = {0, 0};  // alpha, 1/bw: the slowest host's
  if (world.local_size() > 1) {
    const auto [a, bw] = fit_group(local, world.local_size(), backend, device, largest);
    intra[0] = a, intra[1] = 1 / bw;
  }
  comm::all_reduce(world.comm(), std::span<double>(intra, 2), comm::HostOp::Max);
  if (intra[0] > 0) link.alpha_intra = intra[0], link.bw_intra = 1 / intra[1];
  double inter[2] = {0, 0};
  if (world.num_nodes() > 1) {
    MPI_CHECK(MPI_Comm_split(world.comm(), world.local_rank() == 0 ? 0 : MPI_UNDEFINED, world.rank(), &leaders));
    if (leaders != MPI_COMM_NULL) {
      const auto [a, bw] = fit_group(leaders, world.num_nodes(), backend, device, largest);
      inter[0] = a, inter[1] = 1 / bw;
    }
    comm::all_reduce(world.comm(), std::span<double>(inter, 2), comm::HostOp::Max);
    link.alpha_inter = inter[0], link.bw_inter = 1 / inter[1];
  } else {
    // One host: nothing crosses hosts; the figures stand in for a host link never used.
    link.alpha_inter = link.alpha_intra, link.bw_inter = link.bw_intra;
  }
  if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
  MPI_Comm_free(&local);
  link.source =
      detail::str_cat("measured at start-up (", world.num_nodes(), " host(s), ", world.local_size(), " rank(s) each)");
  return link;
}

namespace {

// The GEMM loop that stands for a rank's compute in measure_transport_cpu (one multiply: about a millisecond).
class GemmLoop {
 public:
  GemmLoop() : a_(Tensor::ones(Shape{192, 192}, DType::F32)) {
    for (int i = 0; i < 3; ++i) once();
  }
  void once() {
    (void)matmul(a_, a_);
    ++count_;
  }
  int64_t count() const { return count_; }
  void until(Clock::time_point t0, double seconds) {
    while (since(t0) < seconds) once();
  }

 private:
  Tensor a_;
  int64_t count_ = 0;
};

}  // namespace

void measure_transport_cpu(comm::World& world, LinkModel& link, int64_t gradient_bytes, double contention) {
  if (world.num_nodes() < 2) return;
  GemmLoop loop;
  // The loop's rate with every rank running it: what the ranks compute alone.
  comm::barrier(world.comm());
  const auto t0 = Clock::now();
  loop.until(t0, 0.06);
  const double rate = static_cast<double>(loop.count()) / since(t0);
  // The world's ring all-reduce of the gradients beside the loop, as data parallelism overlaps it with the
  // backward: the loop's time it took (wall time beyond what the loop did in it at its rate alone), the mean
  // over the ranks and two runs.
  const int64_t bytes = link_probe_bytes(gradient_bytes);
  comm::CommunicatorPtr ring = comm::make_communicator(comm::Backend::Ring, world.comm());
  Tensor t = Tensor::ones(Shape{bytes / 4}, DType::F32);
  ring->all_reduce_async(t, comm::ReduceOp::Average)->wait();  // its buffers, once
  double lost = 0;
  constexpr int kRuns = 2;
  for (int run = 0; run < kRuns; ++run) {
    comm::barrier(world.comm());
    const auto t1 = Clock::now();
    const int64_t before = loop.count();
    comm::WorkPtr w = ring->all_reduce_async(t, comm::ReduceOp::Average);
    do loop.once();
    while (!w->test());
    w->wait();
    lost += std::max(0.0, since(t1) - static_cast<double>(loop.count() - before) / rate) / kRuns;
  }
  lost = comm::all_reduce(world.comm(), lost, comm::HostOp::Sum) / world.size();
  // Beyond what the model counts as the ring's CPU already (its copies, at `contention`: cpu_and_wire and
  // exposed_sync in layout_plan.cpp), as a share of its wire time between hosts.
  const double all = allreduce_seconds(link, comm::Backend::Ring, bytes, world.size(), world.local_size());
  const double copies =
      allreduce_seconds(link.copies_only(), comm::Backend::Ring, bytes, world.size(), world.local_size());
  if (all > copies)
    link.inter_cpu_per_wire = std::clamp((lost / contention - copies) / (all - copies), 0.0, kMaxInterCpu);
  link.source = detail::str_cat(link.source,
                                "; the transport beside compute: ", std::lround(100 * link.inter_cpu_per_wire) / 100.0,
                                " s of the cores a second of wire");
}

LinkModel read_link_file(const std::string& path) {
  const json j = io::parse_json_file(path, "--link-calibration");  // a regular file, capped, valid JSON
  const io::JsonIn top(j, path);
  return LinkModel::from_json(top.has("link") ? top.at("link") : top,  // a --save-link file or a bare link
                              detail::str_cat("--link-calibration '", path, "'"));
}

namespace {

struct Timings {
  Clock::time_point start = Clock::now();
  double compute = 0, memory = 0, link = 0;
};

// Memory: the facts without recompute and, when the model can, the activations with it; the smallest
// budget and the largest facts over the ranks. Measured before the compute probe, as a run given by hand
// finds the process: each layout is predicted as that run's memory plan would predict it. (The compute
// probe's whole passes then raise the high-water mark to a plain step's at micro-batch b1, which fits the
// budget with a tenth to spare; fit()'s memory plan counts it.) Returns what a run given by hand holds at
// this point (the CPU: its resident set, the heap's free pages given back; a device: its baseline), from
// which probe_leftover measures what the later probes leave.
int64_t probe_memory(comm::World& world, const TrainerOptions& o, Device device, Watchdog& dog, Module& model,
                     DataSource& data, const StepFn& step_fn, PlanInput& in, Timings& took) {
  const DataInfo& info = data.info();
  std::string error;
  RankBudget budget;
  int64_t own_baseline = 0;
  dog.phase("startup: --layout auto (the memory probe)", 0);
  error = comm::failure_of([&] {
    const auto t0 = Clock::now();
    TrainerOptions plain = o;
    plain.recompute = false;
    recompute_blocks(model, false);
    in.facts = measure_memory_facts(plain, device, model, data, step_fn);
    if (device.is_cuda()) {
      own_baseline = in.facts.baseline;
    } else {  // what a run given by hand holds here: its heap's free pages given back
      empty_cache(device);
      own_baseline = resident_bytes();
    }
    int marked = 0;
    try {
      marked = recompute_blocks(model, true);
    } catch (const std::exception&) {
      marked = 0;  // no sequence of blocks: recompute is no lever here
    }
    if (marked > 0) {
      TrainerOptions r = plain;
      r.recompute = true;
      in.recompute_curve = probe_activations(r, device, model, info, step_fn);
      recompute_blocks(model, false);
    }
    budget = rank_budget_of(o, world, device);
    took.memory += since(t0);
  });
  comm::agree_or_throw(world.comm(), error, "--layout auto (the memory probe)", true);
  int64_t facts[7] = {in.facts.baseline,
                      in.facts.peak_so_far,
                      in.facts.curve.fixed,
                      in.facts.curve.per_image,
                      in.recompute_curve ? in.recompute_curve->fixed : 0,
                      in.recompute_curve ? in.recompute_curve->per_image : 0,
                      -budget.bytes};
  comm::all_reduce(world.comm(), std::span<int64_t>(facts, 7), comm::HostOp::Max);
  in.facts.baseline = facts[0], in.facts.peak_so_far = facts[1];
  in.facts.curve.fixed = facts[2], in.facts.curve.per_image = facts[3];
  if (in.recompute_curve) in.recompute_curve = ActivationCurve{facts[4], facts[5]};
  in.budget = -facts[6];
  in.budget_source = budget.source;
  return own_baseline;
}

// Compute: every rank at once (so the contention of the run is in it), each block at two micro-batches a
// world of `in.world`'s size uses; the mean block over the ranks scaled to the slowest rank's whole pass.
void probe_compute(comm::World& world, const TrainerOptions& o, Device device, Watchdog& dog, Module& model,
                   const DataInfo& info, PlanInput& in, Timings& took) {
  const int W = in.world.size();
  const int64_t G = in.global_batch;
  std::string error;
  dog.phase("startup: --layout auto (measuring the model's blocks)", 0);
  error = comm::failure_of([&] {
    // At most the micro-batch the budget holds without recompute (a probe over it would raise the run's peak).
    auto [b0, b1] = probe_batches(G, W);
    TrainerOptions v = o;
    v.recompute = false, v.pipeline_stages = 1, v.zero = 0;
    // A tenth to spare: the run's memory plan finds the probe's peak in the process's high-water mark.
    while (b1 > 2 && in.budget > 0 && !fits(predict_peak((v.batch = b1, v), in.facts, W).total * 11 / 10, in.budget))
      b1 /= 2;
    b0 = std::min(b0, std::max<int64_t>(1, b1 / 4));
    if (b0 >= b1) b0 = std::max<int64_t>(1, b1 / 2), b1 = std::max<int64_t>(b1, b0 + 1);
    const auto t0 = Clock::now();
    // The passes start together through the ring's polite wait (yield, then sleep): a rank spinning in MPI
    // would take the core from one still computing, where ranks share cores.
    const comm::CommunicatorPtr ring = comm::make_communicator(comm::Backend::Ring, world.comm());
    in.compute = measure_compute(o, device, model, info, b0, b1, [&ring](bool failed) {
      const Tensor flag = Tensor::from_vector({failed ? 1.0 : 0.0}, Shape{1}, DType::F32, Device::cpu());
      ring->all_reduce(flag);
      return flag.to_vector()[0] > 0;
    });
    empty_cache(device);  // the probe's freed heap back to the system: the run's baseline does not hold it
    took.compute = since(t0);
  });
  comm::agree_or_throw(world.comm(), error, "--layout auto (measuring the model)", true);
  // Over the ranks: each block's mean (a maximum per block would add up every rank's worst moment: +40% at
  // ResNet-56 b32 on 4 ranks sharing 2 cores), scaled to the slowest rank's whole pass at each batch; the
  // slowest rank's update.
  std::vector<double> times, slowest(3);
  for (int k = 0; k < 2; ++k)
    for (const auto& b : in.compute.blocks) slowest[static_cast<size_t>(k)] += b.forward[k] + b.backward[k];
  slowest[2] = in.compute.optimizer_seconds_per_byte;
  for (const auto& b : in.compute.blocks)
    times.insert(times.end(), {b.forward[0], b.forward[1], b.backward[0], b.backward[1]});
  comm::all_reduce(world.comm(), std::span<double>(times), comm::HostOp::Sum);
  comm::all_reduce(world.comm(), std::span<double>(slowest), comm::HostOp::Max);
  double mean[2] = {0, 0};
  for (size_t i = 0; i < in.compute.blocks.size(); ++i) {
    BlockProfile& b = in.compute.blocks[i];
    for (double& t : std::span<double>(times).subspan(4 * i, 4)) t /= world.size();
    b.forward[0] = times[4 * i], b.forward[1] = times[4 * i + 1];
    b.backward[0] = times[4 * i + 2], b.backward[1] = times[4 * i + 3];
    for (int k = 0; k < 2; ++k) mean[k] += b.forward[k] + b.backward[k];
  }
  for (int k = 0; k < 2; ++k)
    if (mean[k] > 0)
      for (BlockProfile& b : in.compute.blocks)
        b.forward[k] *= slowest[k] / mean[k], b.backward[k] *= slowest[k] / mean[k];
  in.compute.optimizer_seconds_per_byte = slowest[2];
  in.compute.source =
      detail::str_cat("measured on ", world.size(), " rank(s) at once: the mean block, the slowest rank's whole pass");
}

// CPU ranks share their machine's cores (those of its ranks' affinity; the fewest a host has): the probe
// ran with every rank busy. A machine is a kernel (its boot id): the hosts of an emulated cluster
// (network namespaces, scripts/cluster.sh) share one, and each holds its share of its cores.
void count_cores(comm::World& world, Device device, PlanInput& in) {
  if (device.is_cuda()) return;
  const std::string me = machine_id(world);
  int on_machine = 0;
  for (const std::string& id : comm::all_gather_strings(world.comm(), me)) on_machine += id == me;
  const auto hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double cores = std::min(hardware, on_machine * available_cores());
  in.cores_per_host = comm::all_reduce(world.comm(), cores * world.local_size() / on_machine, comm::HostOp::Min);
  in.threads_per_rank = std::max(1, num_threads());
  in.compute.contention = std::max(1.0, world.local_size() * in.threads_per_rank / in.cores_per_host);
}

// What the probes leave to this run: budgets are checked with it. On the CPU their kernels' plans for
// shapes the run will not use are dropped, and the heap's free pages given back; what is resident beyond
// the point where a run given by hand would be (heap the probes fragmented) is left. On a device the
// tensors the probes leave, as fit()'s memory plan measures its baseline. The largest over the ranks.
int64_t probe_leftover(comm::World& world, const TrainerOptions& o, Device device, Module& model, DataSource& data,
                       const StepFn& step_fn, int64_t own_baseline, Timings& took) {
  std::string error;
  int64_t leftover = 0;
  error = comm::failure_of([&] {
    const auto t0 = Clock::now();
    if (device.is_cuda()) {
      TrainerOptions plain = o;
      plain.recompute = false;
      leftover =
          std::max<int64_t>(0, measure_memory_facts(plain, device, model, data, step_fn).baseline - own_baseline);
    } else {
      release_kernel_plans();
      empty_cache(device);
      leftover = std::max<int64_t>(0, resident_bytes() - own_baseline);
    }
    took.memory += since(t0);
  });
  comm::agree_or_throw(world.comm(), error, "--layout auto (the memory probe)", true);
  return static_cast<int64_t>(comm::all_reduce(world.comm(), static_cast<double>(leftover), comm::HostOp::Max));
}

// Collective: the plan's input measured on every rank (memory facts with and without recompute, the budget,
// every block's compute at the micro-batches a world of `target` uses, the link), the slowest rank's compute
// and the smallest budget. The world's shape is `target`'s.
PlanInput gather_plan_input(comm::World& world, const TrainerOptions& o, Device device, Watchdog& dog, Module& model,
                            DataSource& data, const StepFn& step_fn, const WorldShape& target, Timings& took) {
  const int W = target.size();
  const int64_t G = permanent_errors([&] { return layout_global_batch(o, W); });
  PlanInput in;
  in.world = target;
  in.global_batch = G;
  in.options = o;
  in.backends = backends_for(in.world);
  in.max_stages = step_fn ? 1 : 8;
  // Flags given by hand constrain the choice (never silently replaced): the backend and the bucket size.
  if (o.backend) in.backends = {*o.backend};
  if (o.given.contains("--bucket-mb")) in.bucket_mbs = {o.bucket_mb};
  RT_CHECK(!o.backend || *o.backend != comm::Backend::Nccl || target.cuda,
           "--backend nccl needs a GPU a rank, and these ranks train on the CPU: every layout planned with it would "
           "fail to start; give --backend ring, hierarchical or mpi, or leave --backend out");
  std::string error;
  // A calibration file is read first: a bad one fails before any probe.
  if (!o.link_calibration.empty()) {
    error = comm::failure_of([&] {
      const auto t0 = Clock::now();
      in.link = read_link_file(o.link_calibration);
      took.link = since(t0);
    });
    comm::agree_or_throw(world.comm(), error, "--layout auto (--link-calibration)", true);
  }
  const int64_t own_baseline = probe_memory(world, o, device, dog, model, data, step_fn, in, took);
  probe_compute(world, o, device, dog, model, data.info(), in, took);
  count_cores(world, device, in);
  // The link: measured now, unless a calibration file (read first) gives it.
  if (o.link_calibration.empty() && world.size() > 1) {
    dog.phase("startup: --layout auto (measuring the links)", 0);
    const auto t0 = Clock::now();
    in.link = measure_link(world, device, in.compute.param_bytes());
    // Between hosts while every rank computes: where CPU ranks fill their cores (what the model uses it for).
    if (!device.is_cuda() && world.num_nodes() > 1 && world.local_size() * in.threads_per_rank >= in.cores_per_host)
      measure_transport_cpu(world, in.link, in.compute.param_bytes(), in.compute.contention);
    empty_cache(device);  // the link probe's buffers, freed, back to the system
    took.link = since(t0);
  }
  in.probe_leftover = probe_leftover(world, o, device, model, data, step_fn, own_baseline, took);
  return in;
}

// Rank 0: plans `in`, prints the table and the choice, and returns the plan record's "layout"; errors
// (nothing fits) pass through.
json plan_and_print(const PlanInput& in, const TrainerOptions& o, const Timings& took) {
  const LayoutPlan plan = plan_layouts(in);
  const double planned = since(took.start);
  const PlannedLayout& best = plan.chosen();
  const auto G = static_cast<double>(in.global_batch);
  const double run_s = o.steps > 0 ? best.cost.step * static_cast<double>(o.steps) : 0;
  std::printf("layout auto: %zu layouts of global batch %lld over %d rank(s) on %d host(s), fastest first:\n%s",
              plan.layouts.size(), static_cast<long long>(in.global_batch), in.world.size(), in.world.hosts,
              plan.table().c_str());
  std::printf(
      "layout auto: chose %s (%s): predicted %.1f ms a step, %.0f img/s, peak %s a rank (given by hand; this "
      "run %s more, what the probe left), budget %s (%s), communication %.1f%% of the step\n",
      best.layout.short_text().c_str(), best.layout.flags().c_str(), 1e3 * best.cost.step, G / best.cost.step,
      format_bytes(best.cost.peak).c_str(), format_bytes(in.probe_leftover).c_str(), format_bytes(in.budget).c_str(),
      in.budget_source.c_str(), 100 * best.cost.comm_share());
  std::printf(
      "layout auto: planned in %.2f s (compute probe %.2f s, memory probe %.2f s, links %.2f s): %.2f%% of a "
      "10-minute run%s\n",
      planned, took.compute, took.memory, took.link, 100 * planned / 600,
      run_s > 0 ? detail::str_cat(", ", std::lround(1000 * planned / (run_s + planned)) / 10.0,
                                  "% of this run's predicted ", std::lround(run_s), " s")
                      .c_str()
                : "");
  std::fflush(stdout);
  json j = plan.to_json();
  j["link"] = in.link.to_json();
  j["compute"] = in.compute.to_json();
  j["world"] = {{"hosts", in.world.hosts},
                {"ranks_per_host", in.world.ranks_per_host},
                {"cores_per_host", in.cores_per_host},
                {"threads_per_rank", in.threads_per_rank}};
  j["budget_bytes"] = in.budget;
  j["probe_leftover_bytes"] = in.probe_leftover;
  j["budget_source"] = in.budget_source;
  j["planning_s"] = planned;
  return j;
}

// Rank 0, ringtrain_plan --scaling: the best layout of 1, 2, 4, ... hosts up to in.world's, each with as many
// images per rank as in.world's, from the same measurements. Returns its rows.
json print_scaling(const PlanInput& in) {
  const int64_t per_rank = std::max<int64_t>(1, in.global_batch / in.world.size());
  std::vector<int> hosts;
  for (int h = 1; h < in.world.hosts; h *= 2) hosts.push_back(h);
  hosts.push_back(in.world.hosts);
  std::printf(
      "ringtrain_plan: scaling at %lld images a rank, %d rank(s) a host (the same measurements):\n"
      "  %6s %6s %8s  %-34s %9s %9s %8s %6s %5s\n",
      static_cast<long long>(per_rank), in.world.ranks_per_host, "hosts", "ranks", "batch", "layout", "step ms",
      "img/s", "speed-up", "eff.", "comm");
  json rows = json::array();
  double one = 0;  // one host's img/s per rank
  for (int h : hosts) {
    PlanInput at = in;
    at.world.hosts = h;
    at.global_batch = per_rank * at.world.size();
    at.backends = backends_for(at.world);
    if (in.options.backend) at.backends = {*in.options.backend};
    const LayoutPlan plan = plan_layouts(at);
    const PlannedLayout& best = plan.chosen();
    const double ips = static_cast<double>(at.global_batch) / best.cost.step;
    if (one == 0) one = ips / at.world.size();
    const double speedup = ips / one / in.world.ranks_per_host, efficiency = ips / (one * at.world.size());
    std::printf("  %6d %6d %8lld  %-34s %9.1f %9.0f %8.2f %5.0f%% %4.1f%%\n", h, at.world.size(),
                static_cast<long long>(at.global_batch), best.layout.short_text().c_str(), 1e3 * best.cost.step, ips,
                speedup, 100 * efficiency, 100 * best.cost.comm_share());
    rows.push_back({{"hosts", h},
                    {"ranks", at.world.size()},
                    {"global_batch", at.global_batch},
                    {"layout", best.layout.to_json()},
                    {"step_s", best.cost.step},
                    {"images_per_s", ips},
                    {"efficiency", efficiency},
                    {"comm_share", best.cost.comm_share()}});
  }
  std::fflush(stdout);
  return rows;
}

}  // namespace

json choose_layout(comm::World& world, TrainerOptions& o, Device device, Watchdog& dog, Module& model, DataSource& data,
                   const StepFn& step_fn) {
  Timings took;
  // The world: hosts x ranks per host (the planner's model needs as many on every host).
  const int64_t local_sizes[1] = {world.local_size()};
  if (!comm::same_on_every_rank(world.comm(), local_sizes))
    RT_THROW_PERMANENT("--layout auto: the hosts hold different numbers of ranks; give the layout by hand");
  const PlanInput in = gather_plan_input(world, o, device, dog, model, data, step_fn,
                                         {world.num_nodes(), world.local_size(), device.is_cuda()}, took);
  // Rank 0 plans; every rank applies its choice.
  std::string text, error;
  if (world.is_root()) {
    error = comm::failure_of([&] { text = plan_and_print(in, o, took).dump(); });
  }
  comm::agree_or_throw(world.comm(), error, "--layout auto", true);
  json plan = json::parse(comm::broadcast(world.comm(), text, 0));
  const json& c = plan["chosen"];
  Layout l;
  l.stages = c["stages"].get<int>();
  l.replicas = c["replicas"].get<int>();
  l.batch = c["batch"].get<int64_t>();
  l.accum = c["accum"].get<int64_t>();
  l.zero = c["zero"].get<int>();
  const std::string r = c["recompute"].get<std::string>();
  l.recompute = r == "blocks"     ? RecomputeChoice::Blocks
                : r == "pipeline" ? RecomputeChoice::Pipeline
                                  : RecomputeChoice::Off;
  l.backend = comm::parse_backend(c["backend"].get<std::string>());
  l.bucket_mb = c["bucket_mb"].get<double>();
  if (l.stages > 1)
    l.split = parse_pipeline_split(c["split"].get<std::string>(), static_cast<int>(in.compute.blocks.size()), l.stages);
  l.apply(o);  // fit() marks the blocks to recompute, as for --recompute given
  return plan;
}

json plan_layout_what_if(comm::World& world, const TrainerOptions& o, Device device, Watchdog& dog, Module& model,
                         DataSource& data, const StepFn& step_fn, const LayoutWhatIf& w) {
  Timings took;
  WorldShape target{w.hosts > 0 ? w.hosts : world.num_nodes(),
                    w.ranks_per_host > 0 ? w.ranks_per_host : world.local_size(), device.is_cuda()};
  // The world's rank count is an int everywhere (MPI's too): a product past it wrapped to a wrong world.
  constexpr int64_t kMaxWorld = int64_t{1} << 24;
  const int64_t ranks = int64_t{target.hosts} * target.ranks_per_host;
  RT_CHECK(ranks <= kMaxWorld, "--hosts ", target.hosts, " x --ranks-per-host ", target.ranks_per_host, " is ", ranks,
           " ranks: ringtrain_plan plans worlds of up to ", kMaxWorld, " ranks");
  // With a calibration file nothing is measured: --save-link would write the file's figures back as measured.
  RT_CHECK(w.save_link.empty() || o.link_calibration.empty(), "--save-link ", w.save_link,
           " writes the link measured between these ranks, and --link-calibration ", o.link_calibration,
           " replaces that measurement with the file's figures: give one of the two");
  RT_CHECK(w.save_link.empty() || world.size() > 1, "--save-link ", w.save_link,
           ": the link is measured between ranks; run ringtrain_plan under mpirun with 2 ranks or more (on 2 hosts ",
           "or more for the link between hosts)");
  PlanInput in = gather_plan_input(world, o, device, dog, model, data, step_fn, target, took);
  const LinkModel measured = in.link;
  if (w.link_rate > 0) in.link.bw_inter = w.link_rate;
  if (w.link_latency > 0) in.link.alpha_inter = w.link_latency;
  if (w.intra_rate > 0) in.link.bw_intra = w.intra_rate;
  if (w.intra_latency > 0) in.link.alpha_intra = w.intra_latency;
  if (w.link_rate > 0 || w.link_latency > 0 || w.intra_rate > 0 || w.intra_latency > 0)
    in.link.source = detail::str_cat("given (", in.link.source, " for what was not)");
  if (w.link_rate > 0 || w.link_latency > 0)
    in.link.inter_cpu_per_wire = 0;  // this machine's transport: not that link's
  if (w.device_memory > 0) {
    in.budget = w.device_memory;
    in.budget_source = "--device-memory";
  }
  std::string text, error;
  if (world.is_root()) {
    error = comm::failure_of([&] {
      if (!w.save_link.empty()) {
        io::require_regular_if_exists(w.save_link, "--save-link");
        io::write_text(w.save_link, json{{"link", measured.to_json()}}.dump(1) + "\n", "--save-link");
        std::printf("ringtrain_plan: the link measured here is in %s (--link-calibration %s)\n", w.save_link.c_str(),
                    w.save_link.c_str());
      }
      std::printf(
          "ringtrain_plan: %d host(s) x %d rank(s) (%s); compute measured here (%s), link %s: "
          "%.0f us + %.2f GB/s between hosts, %.1f us + %.2f GB/s inside one\n",
          target.hosts, target.ranks_per_host, w.hosts > 0 || w.ranks_per_host > 0 ? "given" : "this run's",
          in.compute.source.c_str(), in.link.source.c_str(), 1e6 * in.link.alpha_inter, in.link.bw_inter / 1e9,
          1e6 * in.link.alpha_intra, in.link.bw_intra / 1e9);
      json plan = plan_and_print(in, o, took);
      if (w.scaling) plan["scaling"] = print_scaling(in);
      text = plan.dump();
    });
  }
  comm::agree_or_throw(world.comm(), error, "ringtrain_plan", true);
  return json::parse(comm::broadcast(world.comm(), text, 0));
}

}  // namespace ringtrain::runtime
