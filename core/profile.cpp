// core/profile.cpp: see core/profile.h.
#include "core/profile.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "core/check.h"

#if RINGTRAIN_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace ringtrain::profile {

namespace detail {
std::atomic<bool> g_on{false};
}  // namespace detail

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The open session's state shared with the Spans of every thread.
struct Recorder {
  std::mutex mutex;
  Session* session = nullptr;
  std::vector<Event> events;  // a pool of timing events, two per GPU span, reused step after step
  size_t used = 0;            // events handed out this step
  struct Pending {
    const char* family;
    const std::string* layer;
    int event;  // -1 for a host-only span
    double host_ms;
  };
  std::vector<Pending> pending;  // this step's spans, read at end_step
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

thread_local int t_depth = 0;                       // open Spans of this thread
thread_local const std::string* t_layer = nullptr;  // the thread's current layer label
std::atomic<bool> g_per_layer{false};               // an open session records per layer

const std::string* intern(const std::string& label) {
  static std::mutex mutex;
  static std::set<std::string> labels;  // node-based: addresses stay valid
  std::lock_guard<std::mutex> lock(mutex);
  return &*labels.insert(label).first;
}

}  // namespace

const std::string* current_layer() { return t_layer; }

// Each layer is an NVTX range too (inside it, each op's), for Nsight Systems.
LayerScope::LayerScope(const std::string& path) {
  if (!g_per_layer.load(std::memory_order_relaxed) || !on() || path.empty()) return;
  set_ = true;
  previous_ = t_layer;
  t_layer = intern(path);
#if RINGTRAIN_WITH_CUDA
  nvtxRangePushA(t_layer->c_str());
#endif
}

LayerScope::LayerScope(const std::string* label) {
  if (!label || !on()) return;
  set_ = true;
  previous_ = t_layer;
  t_layer = label;
#if RINGTRAIN_WITH_CUDA
  nvtxRangePushA(t_layer->c_str());
#endif
}

LayerScope::~LayerScope() {
  if (!set_) return;
  t_layer = previous_;
#if RINGTRAIN_WITH_CUDA
  nvtxRangePop();
#endif
}

const char* family_of_kernel(const char* entry) {
  struct Entry {
    const char* prefix;
    const char* family;
  };
  // Longest names first where one is a prefix of another.
  static const Entry table[] = {
      {"conv2d_forward", "conv_fwd"},
      {"conv2d_backward_data", "conv_dgrad"},
      {"conv2d_backward_weights", "conv_wgrad"},
      {"batch_norm_forward", "bn_fwd"},
      {"batch_norm_stats", "bn_fwd"},
      {"batch_norm_apply", "bn_fwd"},
      {"batch_norm_update_running", "bn_fwd"},
      {"batch_norm_relu_backward", "bn_bwd"},
      {"batch_norm_backward", "bn_bwd"},
      {"group_norm_forward", "norm_fwd"},
      {"group_norm_backward", "norm_bwd"},
      {"activation", "activation"},
      {"resample2d", "resample"},
      {"strided_copy", "move"},
      {"where", "move"},
      {"sample_mask", "random"},
      {"max_pool2d", "pool"},
      {"avg_pool2d", "pool"},
      {"cross_entropy", "loss"},
      {"softmax", "loss"},
      {"sgd_multi_tensor", "optimizer"},
      {"adamw_multi_tensor", "optimizer"},
      {"unscale_multi_tensor", "optimizer"},
      {"abs_max_multi_tensor", "optimizer"},
      {"square_sum_multi_tensor", "optimizer"},
      {"convert", "cast_copy"},
      {"copy", "cast_copy"},
      {"fill", "elementwise"},
      {"unary", "elementwise"},
      {"binary", "elementwise"},
      {"scalar", "elementwise"},
      {"dropout", "elementwise"},
      {"uniform", "random"},
      {"normal", "random"},
      {"reduce", "reduce"},
      {"gemm", "gemm"},
  };
  for (const Entry& e : table)
    if (std::strncmp(entry, e.prefix, std::strlen(e.prefix)) == 0) return e.family;
  return "other";
}

Session::Session(Device device, bool per_layer) : device_(device), per_layer_(per_layer) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  RT_CHECK(r.session == nullptr, "profile::Session: another session is open in this process");
  r.session = this;
  r.pending.clear();
  r.used = 0;
  g_per_layer.store(per_layer, std::memory_order_relaxed);
  detail::g_on.store(true, std::memory_order_relaxed);
}

Session::~Session() {
  detail::g_on.store(false, std::memory_order_relaxed);
  g_per_layer.store(false, std::memory_order_relaxed);
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.session = nullptr;
  r.pending.clear();
  r.used = 0;
}

void Session::begin_step() {
  Recorder& r = recorder();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.pending.clear();  // spans between steps (a report, a checkpoint) are not the step's
    r.used = 0;
  }
  if (device_.is_cuda()) synchronize(device_);  // the step starts on a drained device...
  syncs_at_begin_ = cuda_host_syncs();          // ...and that wait is not the step's
  step_started_ = now_s();
}

void Session::end_step() {
  const int64_t syncs = cuda_host_syncs() - syncs_at_begin_;
  if (device_.is_cuda()) synchronize(device_);  // the profiler's own wait: not counted
  const double step_ms = (now_s() - step_started_) * 1e3;
  Recorder& r = recorder();
  std::vector<Recorder::Pending> pending;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    pending.swap(r.pending);
    for (const auto& p : pending) {
      double device_ms = 0;
      if (p.event >= 0) {
        const auto i = static_cast<size_t>(p.event);
        device_ms = static_cast<double>(r.events[i + 1].elapsed_ms_since(r.events[i]));
      }
      add(p.family, p.layer, device_ms, p.host_ms);
    }
    r.used = 0;
  }
  syncs_ += syncs;
  step_ms_.push_back(step_ms);
}

void Session::add(const std::string& family, const std::string* layer, double device_ms, double host_ms) {
  auto count = [&](Sum& s) {
    s.calls += 1;
    s.device_ms += device_ms;
    s.host_ms += host_ms;
  };
  count(sums_[family]);
  if (per_layer_) count(layer_sums_[{layer, family}]);
}

Table Session::table() const {
  Table t;
  t.device = device_;
  t.steps = steps();
  if (t.steps == 0) return t;
  std::vector<double> sorted = step_ms_;
  std::sort(sorted.begin(), sorted.end());
  const size_t m = sorted.size() / 2;
  t.median_step_ms = sorted.size() % 2 ? sorted[m] : 0.5 * (sorted[m - 1] + sorted[m]);
  const auto n = static_cast<double>(t.steps);
  double total_ms = 0;
  for (double ms : step_ms_) total_ms += ms;
  t.step_ms = total_ms / n;
  t.syncs_per_step = static_cast<double>(syncs_) / n;
  const bool gpu = device_.is_cuda();
  auto per_step = [&](const std::string& family, const Sum& s) {
    FamilyRow row{family, s.calls / n, s.device_ms / n, s.host_ms / n, 0};
    row.share = t.step_ms > 0 ? (gpu ? row.device_ms : row.host_ms) / t.step_ms : 0;
    return row;
  };
  for (const auto& [family, s] : sums_) {
    t.families.push_back(per_step(family, s));
    t.covered_share += t.families.back().share;
  }
  auto larger = [](const FamilyRow& a, const FamilyRow& b) {
    return a.share != b.share ? a.share > b.share : a.family < b.family;
  };
  std::sort(t.families.begin(), t.families.end(), larger);
  for (const auto& [key, s] : layer_sums_)
    t.layers.push_back({key.first ? *key.first : std::string("(none)"), per_step(key.second, s)});
  std::sort(t.layers.begin(), t.layers.end(), [&](const LayerRow& a, const LayerRow& b) {
    return a.figures.share != b.figures.share ? a.figures.share > b.figures.share
           : a.layer != b.layer               ? a.layer < b.layer
                                              : a.figures.family < b.figures.family;
  });
  return t;
}

void Span::begin(const char* family, Device device, const char* name) {
  entered_ = true;
  if (t_depth++ > 0) return;  // nested: the outer span counts this time
  Recorder& r = recorder();
  active_ = true;
  family_ = family;
  layer_ = t_layer;
  device_ = device;
  if (device.is_cuda()) {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.session) {
      active_ = false;
      return;
    }
    while (r.events.size() < r.used + 2) r.events.push_back(Event::create(device, /*timing=*/true));
    event_ = static_cast<int>(r.used);
    r.used += 2;
    r.events[static_cast<size_t>(event_)].record(current_stream());
  }
#if RINGTRAIN_WITH_CUDA
  nvtxRangePushA(name ? name : family);
  nvtx_ = true;
#else
  (void)name;
#endif
  host_start_ = now_s();
}

void Span::end() noexcept {
  --t_depth;
  if (!active_) return;
  const double host_ms = (now_s() - host_start_) * 1e3;
#if RINGTRAIN_WITH_CUDA
  if (nvtx_) nvtxRangePop();
#endif
  Recorder& r = recorder();
  try {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.session) return;
    if (event_ >= 0) r.events[static_cast<size_t>(event_) + 1].record(current_stream());
    r.pending.push_back({family_, layer_, event_, host_ms});
  } catch (...) {
    // A failed event record loses this span's figures, never the op's result.
  }
}

}  // namespace ringtrain::profile
