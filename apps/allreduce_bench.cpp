// apps/allreduce_bench: an nccl-tests-style all-reduce sweep.
//   mpirun -np 2 ./allreduce_bench --backend ring,mpi --min-bytes 8 --max-bytes 256M --step-factor 2
//                                  --iters 20 --dtype f32 --check --json out.json
// For each size: `--warmup` untimed operations, then `--iters` timed ones; time is the mean per operation,
// the slowest rank's. algbw = bytes / time; busbw = algbw * 2(n-1)/n (the per-link traffic of a ring,
// comparable across world sizes). `--check` runs one more all-reduce on known values and counts wrong
// elements (integer-valued data, so every dtype sums exactly). With several backends the sweep
// alternates them per size (same conditions) and prints busbw ratios of the first against the others.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "comm/communicator.h"
#include "comm/host_collectives.h"
#include "comm/world.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/device.h"
#include "core/dtype.h"
#include "io/files.h"
#include "runtime/config/cli.h"

using namespace ringtrain;
using namespace ringtrain::comm;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

struct Row {
  std::string backend;
  int64_t bytes = 0, count = 0;
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = -1;  // -1: not checked
};

Tensor pattern(int64_t count, DType dt, int rank, Device device) {
  std::vector<double> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<double>(i % 5 + rank % 3);
  return Tensor::from_vector(v, Shape{count}, dt).to(device);
}

int64_t count_wrong(const Tensor& result, int n) {
  Tensor host = result.to(Device::cpu()).to(DType::F64);
  const double* d = host.data<double>();
  double rank_part = 0;
  for (int r = 0; r < n; ++r) rank_part += r % 3;
  int64_t wrong = 0;
  for (int64_t i = 0; i < host.numel(); ++i) wrong += d[i] != static_cast<double>(n * (i % 5)) + rank_part ? 1 : 0;
  return wrong;
}

}  // namespace

// What allreduce_bench's flags can do when an allocation fails (runtime::main_error).
constexpr const char* kMemoryHint =
    "a smaller -e/--max-bytes (and -b/--min-bytes): every rank holds buffers of each size it measures";

int main(int argc, char** argv) try {
  CLI::App app{"All-reduce bandwidth sweep (nccl-tests style)"};
  std::string backends_text = "ring", dtype_text = "f32", json_path, device_text = "cpu", op_text = "sum";
  int64_t min_bytes = 8, max_bytes = int64_t{64} << 20, chunk_bytes = int64_t{512} << 10, net_chunk_bytes = 64000;
  double step_factor = 2;
  int iters = 20, warmup = 5, depth = 4;
  bool check = false;
  app.add_option("--backend", backends_text, "ring, hierarchical, mpi or nccl; a comma list compares them")
      ->capture_default_str();
  runtime::add_bytes(app, "-b,--min-bytes", min_bytes, "smallest size (512, 64K, 16M)")->default_str("8");
  runtime::add_bytes(app, "-e,--max-bytes", max_bytes, "largest size")->default_str("64M");
  runtime::add_number(app, "-f,--step-factor", step_factor, "size multiplier between rows", 1.01, 1024.0);
  runtime::add_number(app, "-n,--iters", iters, "timed operations per size", 1, 10000000);
  runtime::add_number(app, "-w,--warmup", warmup, "untimed operations per size", 0, 10000000);
  app.add_option("--dtype", dtype_text, "f32, bf16 or f16")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  app.add_option("--op", op_text, "sum or avg")->capture_default_str()->check(CLI::IsMember({"sum", "avg"}));
  app.add_option("--device", device_text, "cpu or cuda (nccl needs cuda)")->capture_default_str();
  runtime::add_bytes(app, "--chunk-bytes", chunk_bytes, "ring: bytes per pipelined message")->default_str("512K");
  runtime::add_bytes(app, "--net-chunk-bytes", net_chunk_bytes, "ring: bytes per message between nodes")
      ->default_str("64000");
  runtime::add_number(app, "--pipeline-depth", depth, "ring: receive buffers in flight", 1, 1024);
  app.add_flag("-c,--check", check, "verify results (wrong-element count)");
  app.add_option("--json", json_path, "write {\"results\": [...]} here (rank 0)");
  RT_PARSE_FLAGS(app, argc, argv);

  return run_main(argc, argv, kMemoryHint, [&](World& world) {
    RT_CHECK(min_bytes > 0 && min_bytes <= max_bytes, "--min-bytes (", min_bytes,
             ") must be positive and at most --max-bytes (", max_bytes, ")");
    RT_CHECK(std::isfinite(step_factor) && step_factor > 1,
             "--step-factor must be a finite number greater than 1, got ", step_factor);
    if (const std::string p = io::clobber_problem("--json", json_path, false); !p.empty()) RT_THROW(p);
    const DType dt = parse_dtype(dtype_text);
    const ReduceOp op = op_text == "avg" ? ReduceOp::Average : ReduceOp::Sum;
    RT_CHECK(!(check && op == ReduceOp::Average), "--check verifies sums; drop --op avg or --check");
    const DeviceBinding binding = world.bind(parse_device(device_text));
    CommOptions options;
    options.chunk_bytes = chunk_bytes;
    options.pipeline_depth = depth;
    options.net_chunk_bytes = net_chunk_bytes;
    std::vector<std::pair<std::string, CommunicatorPtr>> comms;
    for (const std::string& name : split(backends_text))
      comms.emplace_back(name, make_communicator(parse_backend(name), world.comm(), options));
    RT_CHECK(!comms.empty(), "--backend: no backend given");
    const int n = world.size();
    if (world.is_root()) {
      std::printf(
          "# ringtrain allreduce_bench: %d ranks on %d node(s), dtype %s, op %s, iters %d, warmup %d, device %s\n", n,
          world.num_nodes(), dtype_text.c_str(), op_text.c_str(), iters, warmup, binding.device.str().c_str());
      for (const auto& [name, comm] : comms) std::printf("# %s: %s\n", name.c_str(), comm->describe().c_str());
      std::printf("# %-8s %12s %12s %6s %11s %11s %11s %8s\n", "backend", "size(B)", "count", "type", "time(us)",
                  "algbw(GB/s)", "busbw(GB/s)", "wrong");
    }
    std::vector<Row> rows;
    const int64_t es = dtype_size(dt);
    for (double b = static_cast<double>(min_bytes); b <= static_cast<double>(max_bytes) * 1.0000001; b *= step_factor) {
      const int64_t count = std::max<int64_t>(1, static_cast<int64_t>(b) / es);
      for (auto& [name, comm] : comms) {
        Tensor t = pattern(count, dt, world.rank(), binding.device);
        for (int i = 0; i < warmup; ++i) comm->all_reduce(t, op);
        comm->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) comm->all_reduce(t, op);
        synchronize(binding.device);
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
        us = all_reduce(world.comm(), us, HostOp::Max);
        Row row{name, count * es, count, us, 0, 0, -1};
        row.algbw = static_cast<double>(row.bytes) / (us * 1e3);
        row.busbw = row.algbw * 2.0 * (n - 1) / n;
        if (check) {
          Tensor fresh = pattern(count, dt, world.rank(), binding.device);
          comm->all_reduce(fresh, ReduceOp::Sum);
          int64_t wrong = count_wrong(fresh, n);
          wrong = all_reduce(world.comm(), wrong);
          row.wrong = wrong;
        }
        if (world.is_root()) {
          std::printf("  %-8s %12lld %12lld %6s %11.1f %11.3f %11.3f %8s\n", name.c_str(),
                      static_cast<long long>(row.bytes), static_cast<long long>(count), dtype_text.c_str(), us,
                      row.algbw, row.busbw, check ? std::to_string(row.wrong).c_str() : "-");
          std::fflush(stdout);
        }
        rows.push_back(row);
      }
    }
    int64_t total_wrong = 0;
    for (const Row& r : rows) total_wrong += std::max<int64_t>(0, r.wrong);
    if (world.is_root() && comms.size() > 1) {
      std::printf("# busbw ratio %s / other, per size\n", comms[0].first.c_str());
      for (size_t i = 0; i < rows.size(); i += comms.size()) {
        std::printf("  %12lld", static_cast<long long>(rows[i].bytes));
        for (size_t k = 1; k < comms.size(); ++k)
          std::printf("  %s/%s=%.2f", rows[i].backend.c_str(), rows[i + k].backend.c_str(),
                      rows[i].busbw / rows[i + k].busbw);
        std::printf("\n");
      }
    }
    if (world.is_root() && !json_path.empty()) {
      nlohmann::json results = nlohmann::json::array();
      for (const Row& r : rows) {
        nlohmann::json j{{"backend", r.backend}, {"bytes", r.bytes},      {"count", r.count},     {"type", dtype_text},
                         {"time_us", r.time_us}, {"algbw_gbps", r.algbw}, {"busbw_gbps", r.busbw}};
        j["wrong"] = r.wrong >= 0 ? nlohmann::json(r.wrong) : nlohmann::json(nullptr);
        results.push_back(j);
      }
      io::write_text(json_path, nlohmann::json{{"ranks", n}, {"results", results}}.dump(2) + "\n", "--json");
    }
    if (world.is_root() && check) std::printf("# wrong elements in total: %lld\n", static_cast<long long>(total_wrong));
    comms.clear();
    return total_wrong == 0 ? 0 : 2;
  });
} catch (...) {
  return runtime::main_error("allreduce_bench", kMemoryHint);  // no exception escapes main
}
