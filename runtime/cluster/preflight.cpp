// runtime/cluster/preflight.cpp: build identity, machine facts and the collective checks.
#include "runtime/cluster/preflight.h"
#include "core/env.h"

#include <unistd.h>

#include <oneapi/dnnl/dnnl.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "comm/host_collectives.h"
#include "comm/mpi_check.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "core/parse.h"
#include "data/codec.h"
#include "data/shards.h"
#include "io/hdf5.h"

extern "C" char* openblas_get_config();

namespace ringtrain::runtime {
namespace {

std::string version_text(int v, int major_div, int minor_div, int minor_mod) {
  if (v <= 0) return "none";
  return std::to_string(v / major_div) + "." + std::to_string(v / minor_div % minor_mod);
}

std::string first_line_with(const char* path, const std::string& key) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) {
      const size_t colon = line.find(':');
      std::string v = colon == std::string::npos ? line : line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "unknown";
}

}  // namespace

std::string build_identity() {
  const CudaStatus& cuda = cuda_status();
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  MPI_CHECK(MPI_Get_library_version(mpi, &length));
  std::string mpi_text(mpi, static_cast<size_t>(length));
  if (const size_t cut = mpi_text.find_first_of(",\n"); cut != std::string::npos) mpi_text.resize(cut);
  unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
  H5_CHECK(H5get_libversion(&h5_major, &h5_minor, &h5_release));
  const dnnl_version_t* dnnl = dnnl_version();
  std::string blas = openblas_get_config();
  if (const size_t cut = blas.find(' ', blas.find(' ') + 1); cut != std::string::npos) blas.resize(cut);
  std::string text =
      detail::str_cat("ringtrain 0.1.0 (CUDA ", RINGTRAIN_WITH_CUDA ? "built in" : "not built", "); CUDA runtime ",
                      version_text(cuda.runtime_version, 1000, 10, 100), ", cuDNN ", cuda.cudnn_version, ", cuBLAS ",
                      cuda.cublas_version, ", NCCL ", cuda.nccl_version, "; ", mpi_text, "; HDF5 ", h5_major, ".",
                      h5_minor, ".", h5_release, "; ", blas, "; oneDNN ", dnnl->major, ".", dnnl->minor, ".",
                      dnnl->patch, ", built ", __DATE__, " ", __TIME__);
  if (const auto fake = env_text("RINGTRAIN_FAKE_BUILD")) text += detail::str_cat(" [", *fake, "]");  // tests
  return text;
}

std::string host_report(const comm::World& world) {
  const CudaStatus& cuda = cuda_status();
  // "MemTotal:       16318812 kB": first_line_with gives "16318812 kB".
  const std::string mem_text = first_line_with("/proc/meminfo", "MemTotal");
  const double mem_kb = to_number<double>(mem_text.substr(0, mem_text.find(' '))).value_or(0);
  std::string text =
      detail::str_cat("host ", world.host(), ": ", first_line_with("/proc/cpuinfo", "model name"), ", ",
                      sysconf(_SC_NPROCESSORS_ONLN), " cores online (", available_cores(), " usable by rank ",
                      world.rank(), "), ", format_bytes(static_cast<int64_t>(mem_kb * 1024)), " memory; ");
  if (cuda.device_count == 0) text += detail::str_cat("no CUDA device (", cuda.reason, ")");
  for (const auto& d : cuda.devices)
    text +=
        detail::str_cat("cuda:", d.index, " ", d.name, " ", format_bytes(d.total_memory_bytes), " cc ", d.compute_major,
                        ".", d.compute_minor, " driver ", version_text(cuda.driver_version, 1000, 10, 100), "; ");
  return text;
}

std::string check_same_build(const comm::World& world) {
  const std::string mine = build_identity();
  const std::string rank0 = comm::broadcast(world.comm(), mine, 0);
  return rank0 == mine ? "" : "runs '" + mine + "' but rank 0 runs '" + rank0 + "'";
}

std::string check_self_test(Device device, std::string& detail_text) {
  try {
    // A 2-layer MLP on random data whose labels are the sign of the first feature: learnable in a few steps.
    Tensor x = Tensor::normal(Shape{64, 32}, 0.0, 1.0, /*seed=*/1, DType::F32, device);
    std::vector<double> host = x.to_vector(), y(64);
    for (int i = 0; i < 64; ++i) y[static_cast<size_t>(i)] = host[static_cast<size_t>(i) * 32] > 0 ? 1 : 0;
    Tensor labels = Tensor::from_vector(y, Shape{64}, DType::I64, device);
    Tensor w1 = Tensor::normal(Shape{64, 32}, 0.0, 0.2, 2, DType::F32, device).set_requires_grad();
    Tensor w2 = Tensor::normal(Shape{2, 64}, 0.0, 0.2, 3, DType::F32, device).set_requires_grad();
    double first = 0, last = 0;
    for (int step = 0; step < 20; ++step) {
      Tensor loss = cross_entropy(linear(relu(linear(x, w1)), w2), labels, 0.1);
      loss.backward();
      if (step == 0) first = loss.item();
      last = loss.item();
      NoGradGuard no_grad;
      for (Tensor* w : {&w1, &w2}) {
        w->add_(w->grad(), -0.5);
        w->zero_grad();
      }
    }
    detail_text = detail::str_cat("MLP loss ", first, " -> ", last, " after 20 SGD steps");
    if (!(last < first * 0.8)) return detail::str_cat("MLP loss did not drop (", first, " -> ", last, ")");
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

AllReduceCheck check_all_reduce(const comm::World& world, comm::Backend backend, Device device, int64_t bytes,
                                int repeats) {
  AllReduceCheck result;
  double seconds = 0;
  try {
    if (device.is_cuda()) set_current_device(device);
    auto comm = comm::make_communicator(backend, world.comm());
    const int64_t count = std::max<int64_t>(1, bytes / 4);
    Tensor t = Tensor::full(Shape{count}, world.rank() + 1.0, DType::F32, device);
    comm->all_reduce(t);  // warm-up, and the value to check
    const double expect = world.size() * (world.size() + 1) / 2.0;
    const float got = t.to(Device::cpu()).data<float>()[count - 1];
    if (got != expect) result.failure = detail::str_cat("result ", got, ", expected ", expect);
    comm->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) comm->all_reduce(t);
    synchronize(device);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / std::max(1, repeats);
    comm->close();
  } catch (const std::exception& e) {
    result.failure = e.what();
  }
  // Every rank arrives here, also after a local failure (the failure is reported collectively).
  seconds = comm::all_reduce(world.comm(), seconds, comm::HostOp::Max);
  const double n = world.size();
  if (seconds > 0)
    result.busbw_gbs = static_cast<double>(std::max<int64_t>(1, bytes / 4) * 4) / seconds / 1e9 * 2.0 * (n - 1) / n;
  return result;
}

namespace {

// Decodes records of `ds` (a sample per shard, or all) and checks each against its shape; returns how many.
int64_t decode_check(const data::ShardDataset& ds, bool all) {
  const data::SplitInfo& info = ds.info();
  int64_t first = 0, decoded = 0;
  for (const auto& shard : info.shards) {
    const int64_t n = shard.records, take = all ? n : std::min(n, kDecodeSample);
    for (int64_t k = 0; k < take; ++k) {
      const int64_t index = first + (take == n ? k : k * (n - 1) / std::max<int64_t>(1, take - 1));
      int32_t label = 0;
      const std::vector<uint8_t> bytes = ds.read_encoded(index, &label);
      data::DecodedImage img;
      try {
        img = data::decode_image(bytes.data(), bytes.size());
      } catch (const std::exception& e) {
        RT_THROW(ds.record_name(index), ": ", e.what());
      }
      const auto want = ds.record_shape(index);
      if (img.height != want[0] || img.width != want[1] || img.channels != want[2])
        RT_THROW(ds.record_name(index), ": decodes to ", img.height, "x", img.width, "x", img.channels, ", but ",
                 info.varied_size() ? "its /shapes row says " : "the split's images are ", want[0], "x", want[1], "x",
                 want[2]);
      if (img.warnings > 0)
        RT_THROW(ds.record_name(index), ": decodes only with libjpeg warnings (", img.first_warning,
                 "): its data is damaged");
      ++decoded;
    }
    first += n;
  }
  return decoded;
}

}  // namespace

std::string check_data(const std::string& dir, std::string& detail_text, bool decode_all) {
  try {
    for (const auto& split : data::read_manifest(dir)) {
      auto ds = data::ShardDataset::open(dir, split.split);
      detail_text += detail::str_cat(split.split, " (", ds.size(), " records, ", split.shards.size(), " shards");
      if (ds.info().encoded)
        detail_text +=
            detail::str_cat(", ", decode_check(ds, decode_all), decode_all ? " (all)" : "", " decoded to their shapes");
      detail_text += ") ";
    }
    detail_text += "valid";
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

bool report_check(const comm::World& world, const std::string& name, const std::string& local_failure,
                  const std::string& pass_detail) {
  const auto all = comm::gather_strings(world.comm(), local_failure);
  const bool ok = comm::all_reduce(world.comm(), int64_t{local_failure.empty() ? 1 : 0}, comm::HostOp::Min) == 1;
  if (world.is_root()) {
    if (ok) {
      std::printf("PASS %s: %s\n", name.c_str(), pass_detail.c_str());
    } else {
      std::printf("FAIL %s:\n", name.c_str());
      for (int r = 0; r < world.size(); ++r)
        if (!all[r].empty()) std::printf("  rank %d (%s): %s\n", r, world.hosts()[r].c_str(), all[r].c_str());
    }
    std::fflush(stdout);
  }
  return ok;
}

void quick_preflight(const comm::World& world, comm::Backend backend, Device device) {
  comm::agree_or_throw(world.comm(), check_same_build(world), "preflight: same build");
  const int64_t bytes = int64_t{16} << 20;
  const AllReduceCheck ar = check_all_reduce(world, backend, device, bytes, 1);
  comm::agree_or_throw(world.comm(), ar.failure, "preflight: all-reduce");
  if (world.is_root()) {
    std::printf("preflight: PASS same build on %d rank(s); PASS %s all-reduce of 16 MiB correct, busbw %.2f GB/s\n",
                world.size(), comm::backend_name(backend), ar.busbw_gbs);
    std::fflush(stdout);
  }
}

}  // namespace ringtrain::runtime
