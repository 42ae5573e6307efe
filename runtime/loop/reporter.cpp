// runtime/loop/reporter.cpp: the startup line and plan record, progress and train records, evaluation lines, the
// summary.
#include "runtime/loop/reporter.h"

#include <algorithm>
#include <cstdio>
#include <span>

#include "comm/host_collectives.h"
#include "comm/mpi_check.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/cpu_features.h"
#include "runtime/loop/trainer.h"
#include "runtime/step/replica.h"
#include "runtime/telemetry/progress.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

Reporter::Reporter(const comm::World& world, const TrainerOptions& o, Device device, const RunPlan& plan,
                   size_t gradient_buckets, json pipeline, json memory, json layout)
    : world_(world),
      o_(o),
      device_(device),
      plan_(plan),
      bar_(use_progress_bar(world, o.progress)),
      log_(o.log_jsonl, world.is_root()),
      gpu_(world, device, !o.log_jsonl.empty()),
      timer_(gradient_buckets),
      pipeline_(std::move(pipeline)),
      memory_(std::move(memory)),
      layout_(std::move(layout)),
      loss_rank_(pipeline_.is_null() ? 0 : (pipeline_["stages"].get<int>() - 1) * pipeline_["replicas"].get<int>()) {}

std::string ranks_by_host(const std::vector<std::string>& hosts) {
  std::vector<std::pair<std::string, std::vector<int>>> by;  // in order of each host's first rank
  for (size_t r = 0; r < hosts.size(); ++r) {
    auto it = std::find_if(by.begin(), by.end(), [&](const auto& h) { return h.first == hosts[r]; });
    if (it == by.end()) it = by.insert(by.end(), {hosts[r], {}});
    it->second.push_back(static_cast<int>(r));
  }
  std::string out;
  for (const auto& [host, ranks] : by) {
    out += detail::str_cat(out.empty() ? "" : ", ", host, " ");
    for (size_t i = 0; i < ranks.size();) {
      size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
      out += detail::str_cat(i ? "," : "", ranks[i], j > i ? detail::str_cat("-", ranks[j]) : std::string());
      i = j + 1;
    }
  }
  return out;
}

void Reporter::announce(const Replica& replica, int threads, const Cursor& at, const std::string& resumed_from,
                        const std::string& run_id, const std::vector<std::string>& data_warnings) {
  if (world_.is_root()) {
    for (const auto& w : data_warnings) std::fprintf(stderr, "%s: warning: %s\n", o_.program.c_str(), w.c_str());
    const std::string layout = pipeline_.is_null()
                                   ? std::string()
                                   : detail::str_cat(" (", pipeline_["stages"].get<int>(), " pipeline stages x ",
                                                     pipeline_["replicas"].get<int>(), " replica(s))");
    std::printf(
        "%s: %s on %s, %d rank(s) on %d node(s)%s, %s backend, batch %lld/%s x %lld accum = %lld global, "
        "%lld steps/epoch, %lld steps, lr %.4g (%s)%s\n",
        o_.program.c_str(), o_.model_name.c_str(), device_.str().c_str(), world_.size(), world_.num_nodes(),
        layout.c_str(), comm::backend_name(replica.backend()), static_cast<long long>(plan_.batch),
        pipeline_.is_null() ? "rank" : "replica", static_cast<long long>(plan_.accum),
        static_cast<long long>(plan_.global_batch), static_cast<long long>(plan_.steps_per_epoch),
        static_cast<long long>(plan_.total_steps), base_lr(o_, plan_), name_of(o_.lr_schedule),
        o_.compression == comm::Compression::None
            ? ""
            : detail::str_cat(", gradients travel as ", compression_name(o_.compression)).c_str());
    // Which ranks live where: when a host is lost and mpirun names only the host ("Remote daemon ... on
    // node node1"), this line says which ranks went with it.
    if (world_.num_nodes() > 1) std::printf("ranks by host: %s\n", ranks_by_host(world_.hosts()).c_str());
    std::fflush(stdout);
    // What scripts/scaling_model.py needs besides the timings: the run's shape and its bucket plan.
    comm::supervisor_event(json{
        {"event", "plan"},
        {"world_size", world_.size()},
        {"replicas", pipeline_.is_null() ? world_.size() : pipeline_["replicas"].get<int>()},
        {"pipeline_stages", pipeline_.is_null() ? 1 : pipeline_["stages"].get<int>()},
        {"nodes", world_.num_nodes()},
        {"batch_size", plan_.batch},
        {"accum_steps", plan_.accum},
        {"global_batch", plan_.global_batch},
        {"step", at.step},
        {"total_steps", plan_.total_steps},
        {"resumed_from", resumed_from},
        {"run_id", run_id},
        {"checkpoint_dir",
         o_.checkpoint_dir}}.dump());
  }
  const int64_t state_bytes = replica.optimizer_state_bytes();
  json record = plan_record(
      {.world_size = world_.size(),
       .nodes = world_.num_nodes(),
       .threads = threads,
       .arch = o_.model_name,
       .backend = comm::backend_name(replica.backend()),
       .device = device_.str(),
       .batch_size = plan_.batch,
       .accum_steps = plan_.accum,
       .global_batch = plan_.global_batch,
       .buckets = replica.sync().buckets(),
       .zero = o_.zero,
       .optimizer_state_bytes = comm::all_gather(world_.comm(), std::span<const int64_t>(&state_bytes, 1))});
  record["total_steps"] = plan_.total_steps;  // what a watcher shows progress against (runtime/tools/job_view.h)
  record["steps_per_epoch"] = plan_.steps_per_epoch;
  record["precision"] = name_of(o_.precision);
  record["tf32"] = on_off(o_.tf32);  // the setting; f32 convolutions and GEMMs use it on a GPU only
  // bf16/fp16 on the CPU: the path its convolutions and GEMMs take here, and which instructions it has.
  if (const std::optional<DType> half = autocast_type(o_.precision); half && device_.is_cpu()) {
    const HalfPath h = cpu_half_path(*half);
    record["cpu_half_path"] = {{"path", h.path}, {"why", h.why}, {"cpu_features", cpu_features().names()}};
  }
  if (!pipeline_.is_null()) record["pipeline"] = pipeline_;
  if (!layout_.is_null()) record["layout"] = layout_;
  if (!memory_.is_null()) {
    const json& by_rank = memory_["predicted_peak_mem_bytes_by_rank"];
    record["predicted_peak_mem_bytes"] = *std::max_element(by_rank.begin(), by_rank.end());
    record["memory"] = memory_;
  }
  log_.write(record);
}

void Reporter::write_record(const json& record) {
  if (world_.is_root()) log_.write(record);
}

void Reporter::add_loss(double loss) {
  if (!std::isfinite(loss)) return;
  interval_loss_ += loss / static_cast<double>(plan_.accum);
  interval_weight_ += 1.0 / static_cast<double>(plan_.accum);
  last_loss_ = loss;
}

void Reporter::report(int64_t epoch, int64_t step, double lr, const json& extra) {
  double stats[2] = {interval_loss_, interval_weight_};  // the loss averaged over ranks
  comm::all_reduce(world_.comm(), std::span<double>(stats, 2));
  const double mean_loss = stats[0] / stats[1];
  const double seconds = std::chrono::duration<double>(Clock::now() - interval_start_).count();
  const auto n = static_cast<double>(timer_.interval_steps());
  const double img_s = n * static_cast<double>(plan_.global_batch) / seconds;
  if (world_.is_root()) {
    ProgressLine line{.epoch = epoch,
                      .epochs = plan_.epochs,
                      .step = step,
                      .total_steps = plan_.total_steps,
                      .step_in_epoch = (step - 1) % plan_.steps_per_epoch + 1,
                      .steps_per_epoch = plan_.steps_per_epoch,
                      .loss = mean_loss,
                      .lr = lr,
                      .img_per_s = img_s,
                      .eta_s = static_cast<double>(plan_.total_steps - step) * seconds / n};
    print_progress(bar_, line);
    json record = train_record({.step = step,
                                .epoch = epoch,
                                .lr = lr,
                                .loss = mean_loss,
                                .img_per_s = img_s,
                                .time = timer_.interval_mean(),
                                .grad_norm = grad_norm_});
    if (extra.is_object()) record.update(extra);
    log_.write(record);
  }
  if (auto record = gpu_.sample(step)) log_.write(*record);
  timer_.reset_interval();
  interval_loss_ = interval_weight_ = 0;
  interval_start_ = Clock::now();
}

void Reporter::end_epoch() const {
  if (bar_ && world_.is_root()) std::printf("\n");
}

void Reporter::evaluated(int64_t epoch, int64_t step, const EvalResult& e) {
  last_eval_ = e;
  if (!world_.is_root()) return;
  if (e.segmentation)
    std::printf("epoch %lld: test pixel accuracy %.2f%%  mean IoU %.2f%%  loss %.4f  (%lld pixels)\n",
                static_cast<long long>(epoch + 1), 100 * e.top1, 100 * e.miou, e.loss, static_cast<long long>(e.count));
  else
    std::printf("epoch %lld: test top-1 %.2f%%  top-5 %.2f%%  loss %.4f  (%lld images)\n",
                static_cast<long long>(epoch + 1), 100 * e.top1, 100 * e.top5, e.loss, static_cast<long long>(e.count));
  std::fflush(stdout);
  log_.write(eval_record(step, epoch, e));
}

TrainResult Reporter::summarize(const Finish& f) {
  TrainResult r;
  r.elapsed_s = f.elapsed_s;
  r.steps = f.at.step;
  r.steps_run = f.at.step - f.first_step;
  double last_loss = last_loss_;  // the last stage's, with pipeline stages
  if (loss_rank_ != 0) MPI_CHECK(MPI_Bcast(&last_loss, 1, MPI_DOUBLE, loss_rank_, world_.comm()));
  r.train_loss = last_loss;
  r.eval = last_eval_;
  r.img_per_s = static_cast<double>(r.steps_run * plan_.global_batch) / r.elapsed_s;
  r.median_step_s = timer_.median_step_s();
  r.skipped_steps = skipped_steps_;
  r.resumed_from = f.resumed_from;
  const double my_peak = peak_rss_bytes();
  // The tensors' part of it (the allocator's high-water mark): the rest is the process and the heap's gaps.
  const double peak_tensors = comm::all_reduce(
      world_.comm(), static_cast<double>(memory_stats(device_).peak_allocated_bytes), comm::HostOp::Max);
  const std::vector<double> peaks = comm::gather(world_.comm(), std::span<const double>(&my_peak, 1));  // rank 0's
  // On a GPU: the caching allocator's high-water mark of memory obtained from the device (what PyTorch's
  // max_memory_reserved reports), the largest over the ranks.
  const double peak_gpu = comm::all_reduce(
      world_.comm(), device_.is_cuda() ? static_cast<double>(memory_stats(device_).peak_reserved_bytes) : 0.0,
      comm::HostOp::Max);
  // Every rank's mean breakdown: a synchronous step goes at the pace of the slowest rank, and rank 0's
  // exposed_comm includes waiting for it; the scaling model needs to tell the two apart.
  double mine[PhaseTimes::kCount];
  timer_.breakdown_mean().to_array(mine);
  const std::vector<double> all = comm::gather(world_.comm(), std::span<const double>(mine, PhaseTimes::kCount));
  if (!world_.is_root()) return r;
  SummaryRecord s;
  s.train_loss = last_loss;
  s.img_per_s = r.img_per_s;
  s.median_step_s = r.median_step_s;
  s.peak_mem_bytes = *std::max_element(peaks.begin(), peaks.end());
  s.peak_mem_bytes_by_rank = peaks;
  s.peak_tensor_bytes = peak_tensors;
  if (!memory_.is_null())
    for (const auto& v : memory_["predicted_peak_mem_bytes_by_rank"])
      s.predicted_peak_mem_bytes = std::max(s.predicted_peak_mem_bytes, v.get<double>());
  s.elapsed_s = r.elapsed_s;
  s.world_size = world_.size();
  s.steps = f.at.step;
  s.breakdown_steps = timer_.breakdown_steps();
  s.breakdown = timer_.breakdown_mean();
  for (int k = 0; k < world_.size(); ++k)
    s.breakdown_by_rank.push_back(PhaseTimes::from_array(all.data() + PhaseTimes::kCount * static_cast<size_t>(k)));
  const auto& buckets = f.replica->sync().buckets();
  for (size_t i = 0; i < buckets.size(); ++i)
    s.buckets.push_back({buckets[i].bytes, timer_.bucket_ready_s(i), timer_.bucket_allreduce_s(i)});
  s.precision = name_of(o_.precision);
  s.device = device_.str();
  if (device_.is_cuda()) s.step_clock = "host, paced by the GPU";
  s.eval = last_eval_;
  if (const auto& scaler = f.replica->scaler()) {
    s.loss_scale = scaler->scale();
    s.skipped_steps = skipped_steps_;
  }
  if (device_.is_cuda()) {
    s.peak_gpu_mem_bytes = peak_gpu;
    s.cudnn_conv_algorithms = cuda_conv_algorithms();  // rank 0's choices, one per pass and shape
  }
  log_.write(summary_record(s));
  std::printf("done: %lld steps in %s, %.0f img/s, final train loss %.4f", static_cast<long long>(f.at.step),
              format_duration(r.elapsed_s).c_str(), r.img_per_s, last_loss);
  if (last_eval_ && last_eval_->segmentation)
    std::printf(", test pixel accuracy %.2f%% mean IoU %.2f%%", 100 * last_eval_->top1, 100 * last_eval_->miou);
  else if (last_eval_)
    std::printf(", test top-1 %.2f%% top-5 %.2f%%", 100 * last_eval_->top1, 100 * last_eval_->top5);
  std::printf("\n");
  std::fflush(stdout);
  return r;
}

}  // namespace ringtrain::runtime
