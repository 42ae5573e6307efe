// runtime/telemetry/run_log.h: the JSONL run log (--log-jsonl): one JSON object per line, appended and flushed record
// by record, written by rank 0. The record types and their fields are the documented schema (README,
// "train_resnet"; scripts/scaling.py and scaling_model.py read them):
//   plan     world_size, nodes, arch, batch_size, accum_steps, global_batch, backend, device, threads,
//            params, buckets [{bytes, numel, parameters}], zero, optimizer_state_bytes (per rank),
//            total_steps, steps_per_epoch, precision, tf32 ("on"/"off"), cpu_half_path (bf16/fp16 on the
//            CPU), pipeline (with --pipeline-stages), and
//            from the memory plan predicted_peak_mem_bytes (the largest rank's) and memory {breakdown,
//            predicted_peak_mem_bytes_by_rank, budget_bytes_by_rank, budget, activations_fixed,
//            activations_per_image, batch_auto} (runtime/memory/memory_plan.h)
//   train    step, epoch, lr, loss, img_per_s, time {data_wait, forward, backward, exposed_comm, optimizer},
//            grad_norm (with --clip-grad-norm)
//   eval     step, epoch, test_top1, test_top5, test_loss, images (segmentation: pixels scored, and
//            test_pixel_accuracy (= test_top1) and test_miou)
//   gpu      step, samples [{rank, util_pct, mem_used_bytes, mem_total_bytes, temperature_c, power_w}]
//   cuda_graph  step, state ("captured", or "off" with reason): --cuda-graph's capture, once a run
//   summary  train_loss, img_per_s, median_step_s, peak_mem_bytes (the largest rank's),
//            peak_mem_bytes_by_rank, peak_tensor_bytes, predicted_peak_mem_bytes (the memory plan's, when
//            it ran), world_size, steps, elapsed_s,
//            breakdown_s, breakdown_by_rank_s, buckets [{bytes, ready_s, allreduce_s}], breakdown_steps,
//            precision, device, step_clock (what median_step_s measured: "host", or on CUDA "host, paced
//            by the GPU"), and when they apply test_top1/test_top5 (test_pixel_accuracy/test_miou),
//            loss_scale/skipped_steps,
//            peak_gpu_mem_bytes/cudnn_conv_algorithms
// The builders below make each record from typed values, so the schema is written down once.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/grad_sync.h"
#include "runtime/telemetry/step_timer.h"
#include "runtime/types.h"

namespace ringtrain::runtime {

class RunLog {
 public:
  RunLog() = default;  // off
  // Opens `path` for appending when `writer` (rank 0); an empty path is off. An unwritable path is an
  // error naming the flag and the path, raised here, before any training.
  RunLog(const std::string& path, bool writer);
  bool on() const { return out_ != nullptr; }
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::unique_ptr<std::ofstream> out_;
};

struct PlanRecord {
  int world_size = 1, nodes = 1, threads = 1;
  std::string arch, backend, device;
  int64_t batch_size = 0, accum_steps = 1, global_batch = 0;
  std::vector<comm::BucketInfo> buckets;
  int zero = 0;                                // ZeRO stage
  std::vector<int64_t> optimizer_state_bytes;  // per rank, once every parameter has stepped
};
nlohmann::json plan_record(const PlanRecord& p);

struct TrainRecord {
  int64_t step = 0, epoch = 0;
  double lr = 0, loss = 0, img_per_s = 0;
  PhaseTimes time;                  // per step, over the logged interval
  std::optional<double> grad_norm;  // with --clip-grad-norm: the last step's norm before clipping
};
nlohmann::json train_record(const TrainRecord& t);

nlohmann::json eval_record(int64_t step, int64_t epoch, const EvalResult& e);

// --cuda-graph: captured at `step`, or (`reason` not empty) off from `step` on, the steps run op by op.
nlohmann::json cuda_graph_record(int64_t step, const std::string& reason);

struct SummaryRecord {
  double train_loss = 0, img_per_s = 0, median_step_s = 0, peak_mem_bytes = 0, elapsed_s = 0;
  std::vector<double> peak_mem_bytes_by_rank;  // peak resident set of each rank's process
  double predicted_peak_mem_bytes = 0;         // the memory plan's, the largest rank's (0: not predicted)
  double peak_tensor_bytes = 0;                // the allocator's high-water mark (the largest rank's): tensors alone
  int world_size = 1;
  int64_t steps = 0, breakdown_steps = 0;
  PhaseTimes breakdown;  // rank 0's mean step
  std::vector<PhaseTimes> breakdown_by_rank;
  struct Bucket {
    int64_t bytes = 0;
    double ready_s = 0, allreduce_s = 0;
  };
  std::vector<Bucket> buckets;
  std::string precision, device;
  // What median_step_s and the breakdown measured: "host" on the CPU; on CUDA "host, paced by the GPU"
  // (runtime/loop/trainer.cpp: each step waits for the one before it to end on the device).
  std::string step_clock = "host";
  std::optional<EvalResult> eval;    // test_top1, test_top5
  std::optional<double> loss_scale;  // with skipped_steps (f16 loss scaling)
  int64_t skipped_steps = 0;
  std::optional<double> peak_gpu_mem_bytes;  // on a GPU, with cudnn_conv_algorithms
  nlohmann::json cudnn_conv_algorithms;
};
nlohmann::json summary_record(const SummaryRecord& s);

}  // namespace ringtrain::runtime
