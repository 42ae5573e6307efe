// core/profile.h: the per-op profiler's recording side. While a profile::Session is open, every kernel
// call through RT_KERNEL (core/dispatch.h) and every copy between tensors is timed: host time on a steady
// clock, and on a CUDA device GPU time too, from a pair of timing events recorded on the op's stream around
// it. Each call belongs to a family (conv_fwd, conv_dgrad, conv_wgrad, bn_fwd, bn_bwd, norm_fwd, norm_bwd
// (layer and group norm), activation, elementwise, pool, resample, move (permute, cat, ...), loss, optimizer,
// cast_copy, reduce, gemm, ...); layers above add their own spans (data, allreduce) with
// profile::Span. Only the outermost call of a thread is counted, so nested calls are never counted twice.
// With the Session closed the cost of a kernel call is one relaxed atomic load. In a CUDA build each call
// is also an NVTX range named after its kernel, for Nsight Systems (only while a Session is open).
// The report (the table, its JSONL record) is built by runtime/telemetry/profiler.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"

namespace ringtrain::profile {

namespace detail {
extern std::atomic<bool> g_on;
}  // namespace detail

inline bool on() { return detail::g_on.load(std::memory_order_relaxed); }

// Per-layer attribution (Session(device, /*per_layer=*/true)): a module's call sets its dotted path as the
// thread's layer (layers/module.cpp), autograd nodes remember the layer they were recorded in and their
// backward runs under it (core/autograd.cpp), and each span is counted under its layer too. Labels are
// interned: a pointer stays valid for the process. nullptr: no layer (the loss, the optimizer, ...).
const std::string* current_layer();
class LayerScope {
 public:
  explicit LayerScope(const std::string& path);   // interns the path; no-op unless per-layer recording is on
  explicit LayerScope(const std::string* label);  // an interned label (or null) as it is
  ~LayerScope();
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;

 private:
  bool set_ = false;
  const std::string* previous_ = nullptr;
};

// The family of a KernelTable entry ("conv2d_forward" -> "conv_fwd"); "other" when unknown.
const char* family_of_kernel(const char* entry);

// One family's figures, per step, over the steps a Session measured.
struct FamilyRow {
  std::string family;
  double calls = 0;      // per step
  double device_ms = 0;  // per step: GPU time (0 on the CPU)
  double host_ms = 0;    // per step: host time of the calls (on the CPU: their whole run time)
  double share = 0;      // of the step: device_ms (GPU) or host_ms (CPU) over step_ms
};
// One (layer, family) pair's figures, per step, with per-layer recording.
struct LayerRow {
  std::string layer;  // "(none)" for ops outside any module
  FamilyRow figures;
};
struct Table {
  Device device = Device::cpu();
  int64_t steps = 0;
  double step_ms = 0;               // mean step, host wall clock from begin_step to end_step (device drained); the
                                    // families' figures are means too, so their shares add up to at most 1
  double median_step_ms = 0;        // the median step, less moved by one slow step
  double syncs_per_step = 0;        // host waits on the GPU per step (core/device.h), the profiler's own excluded
  double covered_share = 0;         // what the families add up to, of the step
  std::vector<FamilyRow> families;  // largest first
  std::vector<LayerRow> layers;     // per-layer recording only; largest first
};

// Records while open (one at a time in a process). Steps are bracketed by begin_step / end_step on the
// thread that trains; end_step waits for the device so that the step's events can be read.
class Session {
 public:
  explicit Session(Device device, bool per_layer = false);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void begin_step();
  void end_step();
  int64_t steps() const { return static_cast<int64_t>(step_ms_.size()); }
  Table table() const;

 private:
  Device device_;
  bool per_layer_ = false;
  int64_t syncs_at_begin_ = 0, syncs_ = 0;
  std::vector<double> step_ms_;
  double step_started_ = 0;  // seconds, steady clock
  struct Sum {
    double calls = 0, device_ms = 0, host_ms = 0;
  };
  std::map<std::string, Sum> sums_;                                       // by family
  std::map<std::pair<const std::string*, std::string>, Sum> layer_sums_;  // by (layer, family)
  void add(const std::string& family, const std::string* layer, double device_ms, double host_ms);
  friend class Span;
};

// A timed region of one family on `device`'s current stream: kernels and copies (core), the data wait and
// the gradient all-reduce (runtime), ... Does nothing unless a Session is open and this is the thread's
// outermost Span.
class Span {
 public:
  Span(const char* family, Device device, const char* name = nullptr) {
    if (on()) begin(family, device, name);
  }
  ~Span() {
    if (entered_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  void begin(const char* family, Device device, const char* name);
  void end() noexcept;
  bool entered_ = false;  // counted in the thread's depth
  bool active_ = false;   // the outermost: records
  bool nvtx_ = false;
  const char* family_ = nullptr;
  const std::string* layer_ = nullptr;
  Device device_ = Device::cpu();
  double host_start_ = 0;
  int event_ = -1;  // index of the start event in the session's pool (CUDA)
};

}  // namespace ringtrain::profile
