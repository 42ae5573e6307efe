// runtime/layout/link_model.h: the planner's network model, alpha-beta per hop inside a host and between hosts:
// the link (measured at start-up by layout_probe.h, read from a calibration file, or given by hand), the units
// people write it in (--link 100Gbit, --link-latency 20us), the seconds of the collectives a layout runs over
// it, and the fit of measured all-reduces to it. Pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "io/json_in.h"

namespace ringtrain::runtime {

// The most LinkModel::inter_cpu_per_wire may be.
inline constexpr double kMaxInterCpu = 8;

// Alpha-beta per hop: a message of B bytes over a hop takes alpha + B / bw seconds.
struct LinkModel {
  double alpha_intra = 5e-6, bw_intra = 4e9;      // between ranks of one host (shared memory, NVLink)
  double alpha_inter = 30e-6, bw_inter = 1.25e8;  // between hosts (one direction of the host's link)
  // The ranks' cores a collective's traffic between hosts takes, per second of its wire time there (the
  // line above), where CPU ranks' threads fill them: TCP in the kernel and MPI's progress over it. Measured at
  // start-up on several hosts (measure_transport_cpu); 0 elsewhere and on links given by hand. No backward
  // hides it; above 1 where the transport's CPU outlasts the link's idle time (docs/LAYOUT.md, "What it
  // measures").
  double inter_cpu_per_wire = 0;
  std::string source = "defaults";  // "measured at start-up", "--link 100Gbit", a file
  // Every hop as fast as between ranks of one host: what a collective takes in its copies and sums alone.
  LinkModel copies_only() const;
  nlohmann::json to_json() const;
  // Read through io/json_in.h: errors name the file and the key, missing or out of its range (every figure
  // positive, up to what the model can hold; inter_cpu_per_wire optional, from 0 to 8); `source` says where it
  // came from. The second form reads `j` as the top level of `file` and takes the file as the source.
  static LinkModel from_json(const io::JsonIn& in, std::string source);
  static LinkModel from_json(const nlohmann::json& j, const std::string& file);
};

// A link's rate as people write it: a number (core/parse.h's rule), a prefix k, M, G or T (powers of 1000,
// either case), then b, bit or bits for bits, or B, byte or bytes for bytes (b is a bit and B a byte: "10Gb/s"
// is 1.25 GB/s, "10GBps" 10 GB/s), "/s" or "ps" after them optional; from 1 Mbit/s to 100 Tbit/s. Bytes per
// second; errors name `flag` and what it takes.
double parse_link_rate(const std::string& text, const std::string& flag);
// A latency: a number and s, ms, us or ns ("20us", "0.1ms"), from 1 ns to 1 s; seconds, errors name `flag`.
double parse_latency(const std::string& text, const std::string& flag);

// Seconds of collectives over a group of `n` consecutive ranks, `per_host` of them on each host they
// span (all of them when the group is inside one host). Ring: 2(n-1) steps of B/n bytes, each as slow as
// the slowest hop (the larger latency, the smaller rate, when the group spans several hosts). Hierarchical: the
// ring inside the host (reduce-scatter and all-gather), then across hosts each local rank's B/per_host slice, the
// host's link shared by its ranks. NCCL is modelled as the hierarchical ring. The same formulas as
// scripts/scaling_model.py's "ring" and "hierarchical" (tests/runtime/link_model_cases.json holds both to them).
double allreduce_seconds(const LinkModel& link, comm::Backend backend, int64_t bytes, int n, int per_host);
// ZeRO-1's halves: a reduce-scatter or an all-gather is half an all-reduce.
double half_allreduce_seconds(const LinkModel& link, comm::Backend backend, int64_t bytes, int n, int per_host);
double p2p_seconds(const LinkModel& link, int64_t bytes, bool across_hosts);
// Fits alpha and bw of a ring of n ranks to measured (bytes, seconds) pairs (least squares on relative
// error, as scripts/scaling_model.py): {alpha, bw}, both clamped positive. Needs two sizes or more.
std::pair<double, double> fit_ring(const std::vector<std::pair<int64_t, double>>& samples, int n);

}  // namespace ringtrain::runtime
