// runtime/layout/link_model.cpp: the link, its units, the collectives' seconds over it, the fit (link_model.h).
#include "runtime/layout/link_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <set>

#include "core/check.h"
#include "core/parse.h"
#include "io/json_in.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

namespace {

// A link figure from a file, in (0, hi] or [lo, hi]: a tiny rate or a huge latency made every prediction
// infinite. A measured file's figures come from a fit (fit_ring), which may give a latency below a
// nanosecond or a rate above any real link's: only what would overflow the model is refused.
double link_figure(const io::JsonIn& in, const char* key, double lo, double hi) {
  const std::string range = detail::str_cat("a positive number ", lo > 0 ? "from " : "above ", lo, " to ", hi);
  if (!in.has(key) || !in.raw()[key].is_number()) in.wrong(key, range);
  const double v = in.raw()[key].get<double>();
  if (!(std::isfinite(v) && v > 0 && v >= lo && v <= hi)) in.wrong(key, range);
  return v;
}
// What --link and --link-latency take: 1 Mbit/s to 100 Tbit/s (bytes per second), 1 ns to 1 s.
constexpr double kMinRate = 1e6 / 8, kMaxRate = 100e12 / 8;
constexpr double kMinLatency = 1e-9, kMaxLatency = 1;
// What a link file may hold: a fit's rate up to 1e15 bytes per second, any positive latency up to 1 s.
constexpr double kMaxFittedRate = 1e15;

}  // namespace

json LinkModel::to_json() const {
  return {
      {"alpha_intra_s", alpha_intra},     {"bw_intra_bytes_per_s", bw_intra},         {"alpha_inter_s", alpha_inter},
      {"bw_inter_bytes_per_s", bw_inter}, {"inter_cpu_per_wire", inter_cpu_per_wire}, {"source", source}};
}

LinkModel LinkModel::copies_only() const {
  LinkModel l = *this;
  l.alpha_inter = alpha_intra, l.bw_inter = bw_intra;
  return l;
}

LinkModel LinkModel::from_json(const io::JsonIn& in, std::string source) {
  LinkModel l;
  l.source = std::move(source);
  l.alpha_intra = link_figure(in, "alpha_intra_s", 0, kMaxLatency);
  l.bw_intra = link_figure(in, "bw_intra_bytes_per_s", kMinRate, kMaxFittedRate);
  l.alpha_inter = link_figure(in, "alpha_inter_s", 0, kMaxLatency);
  l.bw_inter = link_figure(in, "bw_inter_bytes_per_s", kMinRate, kMaxFittedRate);
  if (in.has("inter_cpu_per_wire")) {  // optional: files written before it have none
    const json& v = in.raw()["inter_cpu_per_wire"];
    if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= kMaxInterCpu))
      in.wrong("inter_cpu_per_wire", detail::str_cat("a number from 0 to ", kMaxInterCpu));
    l.inter_cpu_per_wire = v.get<double>();
  }
  return l;
}

LinkModel LinkModel::from_json(const json& j, const std::string& file) { return from_json(io::JsonIn(j, file), file); }

namespace {
// `text` as a number (core/parse.h's rule: decimal, finite, nothing around it) and the unit after it.
std::pair<std::optional<double>, std::string> number_and_unit(const std::string& text) {
  auto [number, unit] = split_number_unit(text);
  return {to_number<double>(number), std::move(unit)};
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}
}  // namespace

double parse_link_rate(const std::string& text, const std::string& flag) {
  const char* takes =
      "a link rate from 1Mbit to 100Tbit: a number, a prefix k, M, G or T, then b, bit or bits for bits or B, "
      "byte or bytes for bytes, and /s or ps if you like (100Gbit, 25Gb/s, 25Gbps, 10GB/s, 10GBps)";
  const auto [number, unit] = number_and_unit(text);
  double factor = 0;  // bytes per second for one of the unit
  if (number && !unit.empty()) {
    size_t k = 0;
    double prefix = 1;
    if (const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(unit[0])));
        p == 'k' || p == 'm' || p == 'g' || p == 't')
      prefix = p == 'k' ? 1e3 : p == 'm' ? 1e6 : p == 'g' ? 1e9 : 1e12, k = 1;
    std::string rest = unit.substr(k);
    for (const char* per : {"/s", "ps"})  // "/s" or "ps", any case
      if (rest.size() > 2 && lower(rest.substr(rest.size() - 2)) == per) {
        rest.resize(rest.size() - 2);
        break;
      }
    // b is a bit and B a byte (IEC 80000-13); spelled out, either case.
    if (rest == "b" || lower(rest) == "bit" || lower(rest) == "bits")
      factor = prefix / 8;
    else if (rest == "B" || lower(rest) == "byte" || lower(rest) == "bytes")
      factor = prefix;
  }
  RT_CHECK(factor > 0, flag, ": expected ", takes, ", got '", text, "'");
  const double rate = *number * factor;
  RT_CHECK(rate >= kMinRate && rate <= kMaxRate, flag, " '", text, "' is ", rate * 8 / 1e9,
           " Gbit/s: expected a link rate from 1Mbit to 100Tbit (", takes, ")");
  return rate;
}

double parse_latency(const std::string& text, const std::string& flag) {
  const char* takes = "a latency from 1ns to 1s: a number and ns, us, ms or s (20us, 0.1ms, 5e-6s)";
  const auto [number, unit] = number_and_unit(text);
  const std::string u = lower(unit);
  const double factor = u == "ns" ? 1e-9 : u == "us" ? 1e-6 : u == "ms" ? 1e-3 : u == "s" ? 1 : 0;
  RT_CHECK(number && factor > 0, flag, ": expected ", takes, ", got '", text, "'");
  const double seconds = *number * factor;
  RT_CHECK(seconds >= kMinLatency && seconds <= kMaxLatency, flag, " '", text, "' is ", seconds, " s: expected ",
           takes);
  return seconds;
}

namespace {
double ring_seconds(double alpha, double bw, double bytes, int n) {
  if (n <= 1 || bytes <= 0) return 0;
  return 2.0 * (n - 1) * (alpha + bytes / n / bw);
}
}  // namespace

double allreduce_seconds(const LinkModel& link, comm::Backend backend, int64_t bytes, int n, int per_host) {
  RT_CHECK(n >= 1 && per_host >= 1 && per_host <= n, "allreduce_seconds: ", n, " ranks, ", per_host, " per host");
  if (n == 1 || bytes <= 0) return 0;
  const int hosts = (n + per_host - 1) / per_host;
  const auto b = static_cast<double>(bytes);
  if (hosts == 1) return ring_seconds(link.alpha_intra, link.bw_intra, b, n);
  // A ring across hosts: every step waits for its slowest hop, the larger latency and the smaller rate
  // (scripts/scaling_model.py's "ring"; tests/runtime/link_model_cases.json holds both to the same seconds).
  if (backend == comm::Backend::Ring || backend == comm::Backend::Mpi || per_host == 1)
    return ring_seconds(std::max(link.alpha_inter, link.alpha_intra), std::min(link.bw_inter, link.bw_intra), b, n);
  // Inside the host (reduce-scatter + all-gather: one ring all-reduce's traffic), then each of the
  // per_host slices across the hosts at once, through the one link the host has.
  return ring_seconds(link.alpha_intra, link.bw_intra, b, per_host) +
         2.0 * (hosts - 1) * (link.alpha_inter + b / hosts / link.bw_inter);
}

double half_allreduce_seconds(const LinkModel& link, comm::Backend backend, int64_t bytes, int n, int per_host) {
  return allreduce_seconds(link, backend, bytes, n, per_host) / 2;
}

double p2p_seconds(const LinkModel& link, int64_t bytes, bool across_hosts) {
  if (bytes <= 0) return 0;
  return across_hosts ? link.alpha_inter + static_cast<double>(bytes) / link.bw_inter
                      : link.alpha_intra + static_cast<double>(bytes) / link.bw_intra;
}

std::pair<double, double> fit_ring(const std::vector<std::pair<int64_t, double>>& samples, int n) {
  RT_CHECK(n >= 2, "fit_ring: a ring of ", n, " ranks has no hops");
  std::set<int64_t> sizes;
  for (const auto& [b, t] : samples) {
    RT_CHECK(b > 0 && std::isfinite(t) && t > 0, "fit_ring: a sample of ", b, " bytes in ", t, " s");
    sizes.insert(b);
  }
  RT_CHECK(sizes.size() >= 2, "fit_ring: needs two message sizes or more, got ", sizes.size());
  // t = x0 * 2(n-1) + x1 * 2(n-1)/n * B, weighted by 1/t (relative error): normal equations of 2 unknowns.
  double a00 = 0, a01 = 0, a11 = 0, r0 = 0, r1 = 0;
  for (const auto& [b, t] : samples) {
    const double u = 2.0 * (n - 1) / t, v = 2.0 * (n - 1) / n * static_cast<double>(b) / t;
    a00 += u * u, a01 += u * v, a11 += v * v, r0 += u, r1 += v;  // target t / t = 1
  }
  const double det = a00 * a11 - a01 * a01;
  double alpha = 0, inv_bw = 0;
  if (std::abs(det) > 1e-300) {
    alpha = (r0 * a11 - r1 * a01) / det;
    inv_bw = (a00 * r1 - a01 * r0) / det;
  }
  // Noise can tip either below zero: then the other alone, fitted to the largest size.
  if (inv_bw <= 0 || alpha <= 0) {
    const auto& [b, t] = *std::max_element(samples.begin(), samples.end());
    alpha = std::max(alpha, 1e-7);
    inv_bw = std::max(1e-15, (t / (2.0 * (n - 1)) - alpha) * n / static_cast<double>(b));
  }
  // What a link file may hold (LinkModel::from_json): at most 1e15 bytes per second and 1 s.
  return {std::min(alpha, 1.0), 1.0 / std::max(inv_bw, 1e-15)};
}

}  // namespace ringtrain::runtime
