// runtime/telemetry/run_log.cpp: the JSONL writer and the record builders.
#include "runtime/telemetry/run_log.h"

#include "core/check.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

RunLog::RunLog(const std::string& path, bool writer) : path_(path) {
  if (path.empty() || !writer) return;
  out_ = std::make_unique<std::ofstream>(path, std::ios::app);
  RT_CHECK(out_->good(), "--log-jsonl: cannot write '", path, "'");
}

void RunLog::write(const json& record) {
  if (!out_) return;
  *out_ << record.dump() << "\n";
  out_->flush();
  RT_CHECK(out_->good(), "--log-jsonl: writing '", path_, "' failed (disk full?)");
}

json plan_record(const PlanRecord& p) {
  json buckets = json::array();
  int64_t params = 0;
  for (const auto& b : p.buckets) {
    buckets.push_back({{"bytes", b.bytes}, {"numel", b.numel}, {"parameters", b.parameters.size()}});
    params += b.numel;
  }
  return {{"type", "plan"},
          {"world_size", p.world_size},
          {"nodes", p.nodes},
          {"arch", p.arch},
          {"batch_size", p.batch_size},
          {"accum_steps", p.accum_steps},
          {"global_batch", p.global_batch},
          {"backend", p.backend},
          {"device", p.device},
          {"threads", p.threads},
          {"params", params},
          {"buckets", buckets},
          {"zero", p.zero},
          {"optimizer_state_bytes", p.optimizer_state_bytes}};
}

json train_record(const TrainRecord& t) {
  json record{{"type", "train"}, {"step", t.step},           {"epoch", t.epoch},        {"lr", t.lr},
              {"loss", t.loss},  {"img_per_s", t.img_per_s}, {"time", t.time.to_json()}};
  if (t.grad_norm) record["grad_norm"] = *t.grad_norm;
  return record;
}

json eval_record(int64_t step, int64_t epoch, const EvalResult& e) {
  json r = {{"type", "eval"},      {"step", step},        {"epoch", epoch},   {"test_top1", e.top1},
            {"test_top5", e.top5}, {"test_loss", e.loss}, {"images", e.count}};
  if (e.segmentation) {  // count is pixels: images stays the key older readers know
    r["test_pixel_accuracy"] = e.top1;
    r["test_miou"] = e.miou;
  }
  return r;
}

json cuda_graph_record(int64_t step, const std::string& reason) {
  json r{{"type", "cuda_graph"}, {"step", step}, {"state", reason.empty() ? "captured" : "off"}};
  if (!reason.empty()) r["reason"] = reason;
  return r;
}

json summary_record(const SummaryRecord& s) {
  json summary{{"type", "summary"},
               {"train_loss", s.train_loss},
               {"img_per_s", s.img_per_s},
               {"median_step_s", s.median_step_s},
               {"peak_mem_bytes", s.peak_mem_bytes},
               {"world_size", s.world_size},
               {"steps", s.steps},
               {"elapsed_s", s.elapsed_s}};
  summary["peak_mem_bytes_by_rank"] = s.peak_mem_bytes_by_rank;
  if (s.predicted_peak_mem_bytes > 0) summary["predicted_peak_mem_bytes"] = s.predicted_peak_mem_bytes;
  summary["peak_tensor_bytes"] = s.peak_tensor_bytes;
  summary["breakdown_s"] = s.breakdown.to_json();
  json by_rank = json::array();
  for (const auto& b : s.breakdown_by_rank) by_rank.push_back(b.to_json());
  summary["breakdown_by_rank_s"] = by_rank;
  json buckets = json::array();
  for (const auto& b : s.buckets)
    buckets.push_back({{"bytes", b.bytes}, {"ready_s", b.ready_s}, {"allreduce_s", b.allreduce_s}});
  summary["buckets"] = buckets;
  summary["breakdown_steps"] = s.breakdown_steps;
  summary["precision"] = s.precision;
  summary["device"] = s.device;
  summary["step_clock"] = s.step_clock;
  if (s.peak_gpu_mem_bytes) {
    summary["peak_gpu_mem_bytes"] = *s.peak_gpu_mem_bytes;
    summary["cudnn_conv_algorithms"] = s.cudnn_conv_algorithms;
  }
  if (s.loss_scale) {
    summary["loss_scale"] = *s.loss_scale;
    summary["skipped_steps"] = s.skipped_steps;
  }
  if (s.eval) {
    summary["test_top1"] = s.eval->top1;
    summary["test_top5"] = s.eval->top5;
    if (s.eval->segmentation) {
      summary["test_pixel_accuracy"] = s.eval->top1;
      summary["test_miou"] = s.eval->miou;
    }
  }
  return summary;
}

}  // namespace ringtrain::runtime
