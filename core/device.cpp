// core/device.cpp: Device naming and parsing (device-independent part of core/device.h).
#include "core/device.h"

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/env.h"
#include "core/tensor.h"

namespace ringtrain {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view digits = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0 && !digits.empty())
      return Device::cuda(index);
  }
  RT_THROW("unknown device '", text, "' (expected cpu, cuda or cuda:N)");
}

namespace {
std::atomic<int64_t> g_host_syncs{0};
std::mutex g_deferred_mutex;
std::vector<detail::DeferredCheck> g_deferred;  // guarded by g_deferred_mutex
thread_local std::vector<detail::DeferredCheck>* t_capture_sink = nullptr;

// Runs one check with its stream current, the caller's again after it.
void run_check(const detail::DeferredCheck& c) {
  struct OnStream {
    Stream before = current_stream();
    explicit OnStream(const Stream& s) { set_current_stream(s); }
    ~OnStream() { set_current_stream(before); }
  } on_stream(c.stream);
  c.check(c.evidence);
}

}  // namespace

bool detail::cuda_sync_every_op() {
  static const bool on = ringtrain_switch("RINGTRAIN_CUDA_SYNC");
  return on;
}

int64_t cuda_host_syncs() { return g_host_syncs.load(std::memory_order_relaxed); }

bool cuda_graph_emulated() {
  // Read each time: tests set it.
  return ringtrain_switch("RINGTRAIN_CUDA_GRAPH_EMULATE");
}

namespace detail {
void count_host_sync() { g_host_syncs.fetch_add(1, std::memory_order_relaxed); }
void set_capture_sink(std::vector<DeferredCheck>* sink) { t_capture_sink = sink; }
}  // namespace detail

void defer_device_check(std::vector<Tensor> evidence, DeviceCheck check) {
  detail::DeferredCheck c{std::move(evidence), std::move(check), current_stream()};
  if (t_capture_sink) {  // the graph's: nothing it reads has been written yet
    t_capture_sink->push_back(std::move(c));
    return;
  }
  if (detail::cuda_sync_every_op()) {
    run_check(c);
    return;
  }
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(g_deferred_mutex);
    full = g_deferred.size() >= kMaxDeferredChecks;
  }
  if (full) run_deferred_checks();
  std::lock_guard<std::mutex> lock(g_deferred_mutex);
  g_deferred.push_back(std::move(c));
}

void run_deferred_checks() {
  std::vector<detail::DeferredCheck> checks;
  {
    std::lock_guard<std::mutex> lock(g_deferred_mutex);
    if (g_deferred.empty()) return;
    checks.swap(g_deferred);  // a check's own reads must not run the list again
  }
  for (const auto& check : checks) run_check(check);
}

size_t deferred_checks_pending() {
  std::lock_guard<std::mutex> lock(g_deferred_mutex);
  return g_deferred.size();
}

}  // namespace ringtrain
