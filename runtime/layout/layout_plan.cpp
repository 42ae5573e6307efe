// runtime/layout/layout_plan.cpp: the layouts, their predicted cost, the choice (layout_plan.h); the link and
// compute models they use are link_model.cpp and compute_profile.cpp.
#include "runtime/layout/layout_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "comm/grad_sync.h"
#include "core/allocator.h"
#include "core/check.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

namespace {

double ms(double s) { return 1e3 * s; }

// GradSync's buckets (comm::bucket_capacity: a small first bucket so communication starts early, then
// bucket_mb each), block by block in backward's order. Each entry: the bucket's bytes and the last block
// (in backward order) whose gradients it holds.
struct Bucket {
  int64_t bytes = 0;
  size_t ready_after = 0;
};
std::vector<Bucket> buckets_of(const std::vector<int64_t>& bytes_backward_order, double bucket_mb) {
  const comm::GradSyncOptions options{.bucket_mb = bucket_mb};  // the first bucket's size as the Trainer runs it
  std::vector<Bucket> out;
  for (size_t i = 0; i < bytes_backward_order.size(); ++i) {
    const int64_t b = bytes_backward_order[i];
    if (b == 0) continue;
    if (out.empty() || out.back().bytes + b > comm::bucket_capacity(options, out.size() - 1)) out.push_back({});
    out.back().bytes += b;
    out.back().ready_after = i;
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Layouts

const char* name_of(RecomputeChoice r) {
  switch (r) {
    case RecomputeChoice::Off:
      return "off";
    case RecomputeChoice::Blocks:
      return "blocks";
    case RecomputeChoice::Pipeline:
      return "pipeline";
  }
  return "?";
}

std::string Layout::flags() const {
  std::string s = detail::str_cat("-b ", batch, " --accum-steps ", accum);
  if (stages > 1) s += detail::str_cat(" --pipeline-stages ", stages, " --pipeline-split ", split_text(split));
  if (zero) s += " --zero 1";
  if (recompute == RecomputeChoice::Blocks) s += " --recompute";
  if (recompute == RecomputeChoice::Pipeline) s += " --pipeline-recompute";
  if (replicas > 1) s += detail::str_cat(" --backend ", comm::backend_name(backend), " --bucket-mb ", bucket_mb);
  return s;
}

std::string Layout::short_text() const {
  std::string s = detail::str_cat("D", replicas, " x S", stages, " b", batch, "x", accum);
  if (zero) s += " zero1";
  if (recompute != RecomputeChoice::Off) s += detail::str_cat(" recompute:", name_of(recompute));
  if (replicas > 1) s += detail::str_cat(" ", comm::backend_name(backend), "/", bucket_mb, "MB");
  return s;
}

void Layout::apply(TrainerOptions& o) const {
  o.batch = batch;
  o.accum = accum;
  o.global_batch = 0;
  o.zero = zero;
  o.recompute = recompute == RecomputeChoice::Blocks;
  o.pipeline_recompute = recompute == RecomputeChoice::Pipeline;
  o.pipeline_stages = stages;
  o.pipeline_split = stages > 1 ? split_text(split) : "";
  if (replicas > 1) o.backend = backend;
  o.bucket_mb = bucket_mb;
}

json Layout::to_json() const {
  json j = {{"replicas", replicas},
            {"stages", stages},
            {"batch", batch},
            {"accum", accum},
            {"zero", zero},
            {"recompute", name_of(recompute)},
            {"backend", comm::backend_name(backend)},
            {"bucket_mb", bucket_mb},
            {"flags", flags()}};
  if (stages > 1) j["split"] = split_text(split);
  return j;
}

json LayoutCost::to_json() const {
  return {{"step_s", step},           {"compute_s", compute},       {"bubble_s", bubble}, {"comm_s", comm},
          {"optimizer_s", optimizer}, {"comm_share", comm_share()}, {"peak_bytes", peak}, {"fits", fits}};
}

std::vector<comm::Backend> backends_for(const WorldShape& w) {
  if (w.cuda) return {comm::Backend::Nccl};
  std::vector<comm::Backend> out{comm::Backend::Ring};
  if (w.hosts > 1 && w.ranks_per_host > 1) out.push_back(comm::Backend::Hierarchical);
  return out;
}

namespace {

// The ranks of a stage's group (consecutive, stage-major) and how they sit on hosts.
int per_host_of(const WorldShape& w, int replicas) { return std::min(replicas, w.ranks_per_host); }
bool stage_link_crosses(const WorldShape& w, int replicas, int stage) {
  for (int j = 0; j < replicas; ++j) {
    const int a = stage * replicas + j, b = a + replicas;
    if (a / w.ranks_per_host != b / w.ranks_per_host) return true;
  }
  return false;
}

// How the hierarchical backend runs the all-reduce of each stage's `replicas` (comm/ring.cpp, split_nodes):
// hierarchically only where the group spans several hosts with the same number, more than one, on each;
// otherwise as the flat ring, the same run as --backend ring. Runs hierarchically for some stage: 0; flat
// with every group inside one host: 1; flat otherwise (one a host, or spread unevenly): 2.
int hierarchical_flat(const WorldShape& w, int replicas, int stages) {
  bool inside = true;
  for (int s = 0; s < stages; ++s) {
    std::map<int, int> on;  // host: the group's ranks on it
    for (int j = 0; j < replicas; ++j) ++on[(s * replicas + j) / w.ranks_per_host];
    const int first = on.begin()->second;
    const bool uniform = std::all_of(on.begin(), on.end(), [&](const auto& h) { return h.second == first; });
    if (uniform && first > 1 && on.size() > 1) return 0;
    inside = inside && on.size() == 1;
  }
  return inside ? 1 : 2;
}

// How much slower than alone a rank computes with `busy` ranks of its host computing (CPU: they share its
// cores; a device each: never).
double sharing(const PlanInput& in, double busy) {
  if (in.cores_per_host <= 0) return 1;
  return std::max(1.0, busy * in.threads_per_rank / in.cores_per_host);
}

// CPU ranks whose threads fill their host's cores.
bool cores_saturated(const PlanInput& in) {
  return in.cores_per_host > 0 && in.world.ranks_per_host * in.threads_per_rank >= in.cores_per_host;
}

// A collective taking `seconds(link)`, split into {CPU, wire}: on CPU ranks that fill their host's cores,
// its copies and sums (what it takes with every hop as fast as between ranks of one host) run on those
// cores and hide under nothing, and so does what its transport between hosts takes from them
// (LinkModel::inter_cpu_per_wire of what a slower link between hosts adds); the rest of that waits on the
// wire and can overlap. All wire where the cores have room, or on devices.
template <typename Seconds>
std::pair<double, double> cpu_and_wire(const PlanInput& in, const Seconds& seconds) {
  const double all = seconds(in.link);
  if (!cores_saturated(in)) return {0.0, all};
  const double copies = std::min(all, seconds(in.link.copies_only()));
  const double f = std::clamp(in.link.inter_cpu_per_wire, 0.0, kMaxInterCpu);
  return {copies + f * (all - copies), std::max(0.0, 1 - f) * (all - copies)};
}

// Blocks [begin, end) backward: exposed seconds of their gradients' sync beyond the backward `window` they
// overlap, and the time the sync takes in all.
double exposed_sync(const PlanInput& in, const Layout& l, const std::vector<double>& backward_seconds,
                    const std::vector<int64_t>& grad_bytes) {
  if (l.replicas <= 1) return 0;
  const std::vector<Bucket> buckets = buckets_of(grad_bytes, l.bucket_mb);
  const int per_host = per_host_of(in.world, l.replicas);
  const double wire = in.options.compression == comm::Compression::None ? 1.0 : 0.5;
  // Where CPU ranks fill their cores, the ring's copies and sums take them from the backward (ResNet-50 64px
  // on 2 ranks of 2 cores: the backward 8% slower): that part of each bucket hides under nothing.
  double t = 0, end = 0, window = 0, cpu = 0;
  std::vector<double> ready(backward_seconds.size());
  for (size_t i = 0; i < backward_seconds.size(); ++i) ready[i] = (window += backward_seconds[i]);
  for (const Bucket& b : buckets) {
    const auto bytes = static_cast<int64_t>(static_cast<double>(b.bytes) * wire);
    const auto [copies, c] = cpu_and_wire(in, [&](const LinkModel& link) {
      return l.zero ? half_allreduce_seconds(link, l.backend, bytes, l.replicas, per_host)
                    : allreduce_seconds(link, l.backend, bytes, l.replicas, per_host);
    });
    cpu += copies;
    t = std::max(ready[b.ready_after], end);
    end = t + c;
  }
  return cpu * sharing(in, in.world.ranks_per_host) + std::max(0.0, end - window);
}

// Peak per rank: the memory plan's arithmetic (memory_plan.h) for this layout's options; a pipeline stage
// holds its blocks' state (their parameters, gradients and optimizer state; the other stages' weights
// dropped) and its blocks' activations of the micro-batches in flight on it (1F1B: S - s on stage s, GPipe:
// all M), the largest stage counted; with --pipeline-recompute the stage's inputs of the micro-batches in
// flight, one micro-batch's block inputs and its widest block's activations with that block's gradients.
MemoryPrediction predict_memory(const PlanInput& in, const Layout& l) {
  TrainerOptions v = in.options;
  l.apply(v);
  MemoryFacts f = in.facts;
  if (l.recompute == RecomputeChoice::Blocks && in.recompute_curve) f.curve = *in.recompute_curve;
  MemoryPrediction p = predict_peak(v, f, in.world.size());
  if (l.stages <= 1) return p;
  const auto& blocks = in.compute.blocks;
  double all = 0;
  for (const BlockProfile& b : blocks) all += static_cast<double>(b.activation_bytes_per_image);
  int64_t total_params = 0;
  for (const BlockProfile& b : blocks) total_params += b.param_bytes;
  MemoryPrediction worst;
  for (int s = 0; s < l.stages; ++s) {
    const int begin = l.split[static_cast<size_t>(s)], end = l.split[static_cast<size_t>(s) + 1];
    // The stage's own state: its blocks' parameters (the others' weights are dropped after the start).
    MemoryFacts fs = f;
    int64_t params = 0;
    for (int i = begin; i < end; ++i) params += blocks[static_cast<size_t>(i)].param_bytes;
    if (total_params > 0 && f.param_bytes > 0) {
      fs.param_bytes = params * l.stages;  // predict_peak gives a stage 1/S of it
      fs.baseline = std::max<int64_t>(0, f.baseline - (total_params - params));
    }
    MemoryPrediction q = predict_peak(v, fs, in.world.size());
    int64_t act = q.activations;
    const int64_t in_flight =
        in.options.pipeline_schedule == PipelineSchedule::GPipe ? l.accum : std::min<int64_t>(l.stages - s, l.accum);
    if (l.recompute == RecomputeChoice::Pipeline && all > 0) {
      // Recomputed block by block (Pipeline::recomputed_backward): the stage's inputs of the micro-batches in
      // flight, then in backward one micro-batch's block inputs (the outputs of its blocks but the last) and
      // the widest block's activations with its output's gradient and its input's (none for the data's).
      auto out = [&](int i) { return i >= 0 ? blocks[static_cast<size_t>(i)].output_bytes_per_image : 0; };
      const int64_t input = out(begin - 1);
      int64_t inputs = 0, widest = 0;
      for (int i = begin; i < end; ++i) {
        if (i + 1 < end) inputs += out(i);
        widest = std::max(widest, blocks[static_cast<size_t>(i)].activation_bytes_per_image + out(i) + out(i - 1));
      }
      act = f.curve.fixed + l.batch * (in_flight * input + inputs + widest);
    } else if (l.recompute == RecomputeChoice::Pipeline) {  // not measured per block: a stage's share, bounded
      int64_t boundary = 0;
      for (size_t t = 1; t < l.split.size() - 1; ++t)
        boundary = std::max(boundary, blocks[static_cast<size_t>(l.split[t] - 1)].output_bytes_per_image);
      act = std::min(act, f.curve.fixed + f.curve.per_image * l.batch / l.stages + l.stages * l.batch * boundary);
    } else if (all > 0) {  // not measured (a calibration of old): the memory plan's one micro-batch of the model
      double share = 0;
      for (int i = begin; i < end; ++i)
        share += static_cast<double>(blocks[static_cast<size_t>(i)].activation_bytes_per_image) / all;
      act = f.curve.fixed + static_cast<int64_t>(static_cast<double>(f.curve.per_image * l.batch) * share *
                                                 static_cast<double>(in_flight));
    }
    q.total = q.total - q.activations + act;
    q.activations = act;
    q.total = std::max(q.total, f.peak_so_far);
    if (q.total > worst.total) worst = q;
  }
  return worst;
}

}  // namespace

LayoutCost predict_layout(const PlanInput& in, const Layout& l) {
  const ComputeProfile& c = in.compute;
  const size_t n = c.blocks.size();
  RT_CHECK(n > 0, "the layout plan: no block was measured");
  LayoutCost cost;
  cost.memory = predict_memory(in, l);
  cost.peak = cost.memory.total;
  cost.fits = in.budget <= 0 || fits(cost.peak + in.probe_leftover, in.budget);
  const double opt_per_byte = c.optimizer_seconds_per_byte;
  if (l.stages == 1) {
    double fwd = 0;
    std::vector<double> back(n);
    std::vector<int64_t> bytes(n);
    for (size_t k = 0; k < n; ++k) {  // backward order: the last block first
      const size_t i = n - 1 - k;
      const double f = c.forward(i, l.batch);
      fwd += f;
      back[k] = c.backward(i, l.batch);
      if (l.recompute == RecomputeChoice::Blocks && c.blocks[i].recomputable)
        back[k] = (back[k] + f) / c.scale_at(l.batch);  // forward again, then backward, in the cache
      bytes[k] = c.blocks[i].param_bytes;
    }
    // Every rank busy all the step: as fast as the probe's ranks were, where as many shared the cores.
    const double speed = sharing(in, in.world.ranks_per_host) / c.contention;
    fwd *= speed;
    double bwd = 0;
    for (double& b : back) bwd += (b *= speed);
    cost.compute = static_cast<double>(l.accum) * (fwd + bwd);
    cost.comm = exposed_sync(in, l, back, bytes);
    const int64_t params = c.param_bytes();
    // ZeRO-1 updates 1/D of the state, but copying the shards in and out and the weights' all-gather cost
    // about what that saves (measured no faster than plain on the CPU): the whole update's time either way,
    // so ZeRO-1 is a memory lever and never makes a larger world superlinear.
    cost.optimizer = opt_per_byte * static_cast<double>(params) * speed;  // measured all at once, too
    if (l.zero && l.replicas > 1) {  // the weights' all-gather, under the next step's forward
      const int per_host = per_host_of(in.world, l.replicas);
      const auto [copies, gather] = cpu_and_wire(in, [&](const LinkModel& link) {
        return half_allreduce_seconds(link, l.backend, params, l.replicas, per_host);
      });
      cost.comm += copies * sharing(in, in.world.ranks_per_host) + std::max(0.0, gather - fwd);
    }
  } else {
    const auto S = static_cast<size_t>(l.stages);
    const double all_busy = sharing(in, in.world.ranks_per_host) / c.contention;
    std::vector<double> stage(S, 0);
    double worst_tail = 0, sum = 0, worst = 0, sends = 0, worst_send = 0;
    for (size_t s = 0; s < S; ++s) {
      const auto begin = static_cast<size_t>(l.split[s]), end = static_cast<size_t>(l.split[s + 1]);
      double fwd = 0;
      std::vector<double> back;
      std::vector<int64_t> bytes;
      int64_t params = 0;
      for (size_t i = end; i-- > begin;) {
        const double f = c.forward(i, l.batch);
        fwd += f;
        back.push_back(c.backward(i, l.batch));
        bytes.push_back(c.blocks[i].param_bytes);
        params += c.blocks[i].param_bytes;
      }
      // --pipeline-recompute runs the stage's forward twice more in backward: once without gradients keeping
      // the blocks' inputs (all but the last block), then each block again before its backward.
      double bwd = 0;
      for (double b : back) bwd += b;
      // Each block's second forward runs just before its backward, both in the cache (scale_at).
      if (l.recompute == RecomputeChoice::Pipeline)
        bwd = fwd - c.forward(end - 1, l.batch) + (fwd + bwd) / c.scale_at(l.batch);
      stage[s] = fwd + bwd;
      double send = 0;
      if (s + 1 < S)
        send = p2p_seconds(in.link, c.blocks[end - 1].output_bytes_per_image * l.batch,
                           stage_link_crosses(in.world, l.replicas, static_cast<int>(s)));
      sends += 2 * send;
      worst_send = std::max(worst_send, 2 * send);
      sum += stage[s];
      worst = std::max(worst, stage[s]);
      const double update = opt_per_byte * static_cast<double>(params) * all_busy;  // every rank at once
      const double tail = exposed_sync(in, l, back, bytes) + update;
      worst_tail = std::max(worst_tail, tail);
      cost.optimizer = std::max(cost.optimizer, update);
    }
    // The M + S - 1 slots of the schedule: min(j + 1, S, M, M + S - 1 - j) stages busy in slot j (filling,
    // steady, draining), each at the speed its busy ranks on a host leave; the probe had all busy.
    const int64_t M = l.accum, slots = M + l.stages - 1;
    double speed = 0;
    for (int64_t j = 0; j < slots; ++j) {
      const int64_t busy_stages = std::min({j + 1, static_cast<int64_t>(l.stages), M, slots - j});
      speed += sharing(in, static_cast<double>(busy_stages) * in.world.ranks_per_host / l.stages);
    }
    speed /= static_cast<double>(slots) * c.contention;
    cost.compute = static_cast<double>(l.accum) * worst * speed;
    // Filling and draining: every stage once beside the slowest, and the sends along the way; each
    // steady micro-batch waits for the slowest link's send and its gradient's.
    cost.bubble = (sum - worst) * speed + sends + static_cast<double>(l.accum - 1) * worst_send;
    cost.comm = worst_tail - cost.optimizer;
  }
  cost.step = cost.compute + cost.bubble + cost.comm + cost.optimizer;
  // The inputs are bounded (link figures, measured times), so a figure that is not finite is a defect here;
  // it must never reach a table or a record as inf, nan or a 300-digit time.
  for (const auto& [name, v] : {std::pair{"compute", cost.compute}, std::pair{"bubble", cost.bubble},
                                std::pair{"communication", cost.comm}, std::pair{"optimizer", cost.optimizer}})
    RT_CHECK(std::isfinite(v) && std::abs(v) < 1e9, "the layout plan: layout ", l.flags(), " predicts a ", name,
             " time of ", v, " s a step, which no run takes: its inputs (the link's figures: --link, --link-latency, ",
             "--link-calibration; the measured times) are out of range");
  return cost;
}

std::vector<Layout> enumerate_layouts(const PlanInput& in, std::vector<std::string>* skipped) {
  const int world = in.world.size();
  const int64_t G = in.global_batch;
  RT_CHECK(world >= 1 && G >= 1, "the layout plan: a global batch of ", G, " over ", world, " ranks");
  const int blocks = static_cast<int>(in.compute.blocks.size());
  std::vector<std::string> reasons;
  auto skip = [&](std::string why) { reasons.push_back(std::move(why)); };
  std::vector<Layout> out;
  for (int S = 1; S <= world; ++S) {
    if (world % S != 0) continue;
    if (S > 1 && (S > blocks || S > in.max_stages)) {
      skip(detail::str_cat(S, " stages: ",
                           S > blocks ? detail::str_cat("the model has ", blocks, " blocks")
                                      : std::string(in.max_stages <= 1 ? "a custom step function sees the whole model"
                                                                       : "more stages than the planner considers")));
      continue;
    }
    const int D = world / S;
    if (G % D != 0) {
      skip(detail::str_cat(S, " stage", S > 1 ? "s" : "", ": the global batch ", G, " is not a multiple of its ", D,
                           " replicas"));
      continue;
    }
    const int64_t per = G / D;
    std::vector<int64_t> accums;
    for (int64_t m : S == 1 ? std::vector<int64_t>{1, 2, 4} : std::vector<int64_t>{S, 2 * S, 4 * S})
      if (per % m == 0) accums.push_back(m);
    if (accums.empty()) {
      skip(detail::str_cat(S, " stages: ", per, " images per replica cannot make ", S, " micro-batches"));
      continue;
    }
    std::vector<int> zeros{0};
    if (S == 1 && D > 1 && in.options.compression == comm::Compression::None) zeros.push_back(1);
    std::vector<comm::Backend> backends{in.backends.empty() ? comm::Backend::Ring : in.backends.front()};
    std::vector<double> buckets{in.options.bucket_mb};
    if (D > 1) {
      backends = in.backends.empty() ? std::vector<comm::Backend>{comm::Backend::Ring} : in.backends;
      // Both considered, and hierarchical would run the flat ring: the same layout twice under two names.
      const bool both = std::count(backends.begin(), backends.end(), comm::Backend::Ring) > 0;
      const int flat = hierarchical_flat(in.world, D, S);
      if (both && flat > 0 && std::erase(backends, comm::Backend::Hierarchical) > 0)
        skip(detail::str_cat(S, S > 1 ? " stages" : " stage", ": --backend hierarchical, where each stage's ", D,
                             " replicas ", flat == 1 ? "share a host" : "are one a host or spread unevenly",
                             ": it runs the flat ring, the same layout as --backend ring"));
      // Bucket sizes that make other buckets than the first size (a small model is one bucket either way).
      buckets.clear();
      std::set<size_t> counts;
      std::vector<int64_t> bytes;
      for (size_t i = in.compute.blocks.size(); i-- > 0;) bytes.push_back(in.compute.blocks[i].param_bytes);
      for (double mb : in.bucket_mbs)
        if (counts.insert(buckets_of(bytes, mb).size()).second) buckets.push_back(mb);
    }
    auto add_all = [&](int64_t m) {
      bool plain_fits = false;
      for (int z : zeros)
        for (comm::Backend be : backends)
          for (double mb : buckets) {
            Layout l;
            l.stages = S, l.replicas = D, l.batch = per / m, l.accum = m, l.zero = z, l.backend = be, l.bucket_mb = mb;
            if (S > 1) {
              std::vector<BlockCost> costs;
              for (size_t i = 0; i < in.compute.blocks.size(); ++i)
                costs.push_back(
                    {in.compute.blocks[i].name, in.compute.forward(i, l.batch) + in.compute.backward(i, l.batch)});
              l.split = balance_time(costs, S);
            }
            const bool f = predict_layout(in, l).fits;
            plain_fits = plain_fits || f;
            out.push_back(l);
            const bool can = S > 1 || in.recompute_curve.has_value();
            if (!f && can) {
              Layout r = l;
              r.recompute = S > 1 ? RecomputeChoice::Pipeline : RecomputeChoice::Blocks;
              out.push_back(r);
            }
          }
      return plain_fits;
    };
    bool any = false;
    for (int64_t m : accums) any = add_all(m) || any;
    if (!any && S == 1) {
      // More accumulation, a smaller micro-batch, until one fits or the micro-batch is one image.
      for (int64_t m = accums.back() * 2; m <= per; m *= 2)
        if (per % m == 0 && add_all(m)) break;
    }
    if (S == 1 && in.recompute_curve)
      skip("recompute (--recompute) where the same layout fits without it: it runs every block's forward twice");
    if (S > 1) skip(detail::str_cat(S, " stages: --pipeline-recompute where the stage fits without it"));
  }
  if (out.empty()) {
    std::string why;
    for (const auto& r : reasons)
      if (r.find("recompute") == std::string::npos) why += (why.empty() ? "" : "; ") + r;
    RT_THROW_PERMANENT("--layout auto: the global batch ", G, " cannot be split over the world of ", world, " ranks (",
                       why, "); give a --global-batch that the rank count divides");
  }
  if (skipped) skipped->insert(skipped->end(), reasons.begin(), reasons.end());
  return out;
}

LayoutPlan plan_layouts(const PlanInput& in) {
  LayoutPlan plan;
  plan.global_batch = in.global_batch;
  for (const Layout& l : enumerate_layouts(in, &plan.skipped)) plan.layouts.push_back({l, predict_layout(in, l), ""});
  std::stable_sort(plan.layouts.begin(), plan.layouts.end(), [](const PlannedLayout& a, const PlannedLayout& b) {
    if (a.cost.fits != b.cost.fits) return a.cost.fits;
    return a.cost.fits ? a.cost.step < b.cost.step : a.cost.peak < b.cost.peak;
  });
  const PlannedLayout& best = plan.layouts.front();
  if (!best.cost.fits)
    RT_THROW_PERMANENT(
        "--layout auto: no layout of the ", plan.layouts.size(), " considered fits the budget of ",
        format_bytes(in.budget), " a rank (", in.budget_source, ", less 5% to spare); the smallest predicted peak is ",
        best.cost.memory.str(), " with ", best.layout.flags(),
        in.probe_leftover > 0
            ? detail::str_cat(", and this run holds ", format_bytes(in.probe_leftover), " more from the layout probe")
            : std::string(),
        ". Raise --max-memory, or use a smaller --global-batch");
  for (size_t i = 1; i < plan.layouts.size(); ++i) {
    PlannedLayout& p = plan.layouts[i];
    if (!p.cost.fits) {
      p.why_not = detail::str_cat("does not fit: ", format_bytes(p.cost.peak),
                                  in.probe_leftover > 0
                                      ? detail::str_cat(" (+ ", format_bytes(in.probe_leftover), " the probe left)")
                                      : std::string(),
                                  " over the budget of ", format_bytes(in.budget), " less 5%");
      continue;
    }
    std::string parts;
    auto part = [&](const char* what, double mine, double theirs) {
      const double d = mine - theirs;
      if (std::abs(d) >= 0.0005 * best.cost.step || std::abs(d) >= 1e-4)
        parts += detail::str_cat(parts.empty() ? "" : ", ", what, " ", d >= 0 ? "+" : "",
                                 std::lround(ms(d) * 10) / 10.0, " ms");
    };
    part("compute", p.cost.compute, best.cost.compute);
    part("bubble", p.cost.bubble, best.cost.bubble);
    part("comm", p.cost.comm, best.cost.comm);
    part("optimizer", p.cost.optimizer, best.cost.optimizer);
    const double pct = 100 * (p.cost.step / best.cost.step - 1);
    p.why_not = detail::str_cat("slower by ", std::lround(pct * 10) / 10.0, "%", parts.empty() ? "" : ": " + parts);
  }
  return plan;
}

std::string LayoutPlan::table(size_t best) const {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "  %-3s %-44s %10s %9s %11s %6s\n", "#", "layout", "step", "img/s", "peak/rank",
                "comm");
  s += line;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const PlannedLayout& p = layouts[i];
    const double ips = p.cost.step > 0 ? static_cast<double>(global_batch) / p.cost.step : 0;
    if (i < best || i == 0) {
      std::snprintf(line, sizeof line, "  %-3zu %-44s %8.1fms %9.1f %11s %5.1f%%%s\n", i + 1,
                    p.layout.short_text().c_str(), ms(p.cost.step), ips, format_bytes(p.cost.peak).c_str(),
                    100 * p.cost.comm_share(), i == 0 ? "  <- chosen" : "");
      s += line;
      if (i > 0) s += "        " + p.why_not + "\n";
    } else {
      s += detail::str_cat("  ", i + 1, "   ", p.layout.short_text(), ": ", p.why_not, "\n");
    }
  }
  for (const std::string& k : skipped) s += "  not considered: " + k + "\n";
  return s;
}

json LayoutPlan::to_json() const {
  json all = json::array();
  for (const PlannedLayout& p : layouts) {
    json j = p.layout.to_json();
    j["predicted"] = p.cost.to_json();
    if (!p.why_not.empty()) j["why_not"] = p.why_not;
    all.push_back(j);
  }
  return {{"global_batch", global_batch},
          {"chosen", layouts.front().layout.to_json()},
          {"predicted", layouts.front().cost.to_json()},
          {"considered", all},
          {"skipped", skipped}};
}

}  // namespace ringtrain::runtime
