// apps/ringtrain_env: the preflight doctor, alone or under mpirun.
//   mpirun -np 8 ./ringtrain_env [--data DIR] [--bytes 16M]
// Prints per host the CPU model, cores, memory and GPUs; the library versions (CUDA runtime, driver,
// cuDNN, cuBLAS, NCCL, MPI, HDF5, OpenBLAS, oneDNN); the rank -> host -> device map. Then runs checks,
// each printed as PASS or FAIL with its reason:
//   same build      every rank runs the same ringtrain build against the same library versions
//   self-test       a small MLP learns on every device of every rank
//   all-reduce      a checked, timed all-reduce per available backend, with its busbw
//   data            with --data, every split of the manifest opens and validates (checksums, labels)
// The exit code is non-zero when any check fails on any rank.
#include <hdf5.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <oneapi/dnnl/dnnl.h>

#include "comm/communicator.h"
#include "comm/world.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/device.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "data/shards.h"

extern "C" char* openblas_get_config();

using namespace ringtrain;

namespace {

std::string version_text(int v, int major_div, int minor_div, int minor_mod) {
  if (v <= 0) return "none";
  return std::to_string(v / major_div) + "." + std::to_string(v / minor_div % minor_mod);
}

// A 2-layer MLP step on random data; returns the loss before and after 20 SGD steps.
std::pair<double, double> self_test(Device device) {
  Tensor x = Tensor::normal(Shape{64, 32}, 0.0, 1.0, /*seed=*/1, DType::F32, device);
  // Labels depend on the sign of the first feature: learnable in a few steps.
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
  return {first, last};
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

std::string library_versions() {
  const CudaStatus& cuda = cuda_status();
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  MPI_Get_library_version(mpi, &length);
  std::string mpi_text(mpi, static_cast<size_t>(length));
  if (const size_t cut = mpi_text.find_first_of(",\n"); cut != std::string::npos) mpi_text.resize(cut);
  unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
  H5get_libversion(&h5_major, &h5_minor, &h5_release);
  const dnnl_version_t* dnnl = dnnl_version();
  std::string blas = openblas_get_config();
  if (const size_t cut = blas.find(' ', blas.find(' ') + 1); cut != std::string::npos) blas.resize(cut);
  return detail::str_cat("ringtrain 0.1.0 (CUDA ", RINGTRAIN_WITH_CUDA ? "built in" : "not built", "); CUDA runtime ",
                         version_text(cuda.runtime_version, 1000, 10, 100), ", cuDNN ", cuda.cudnn_version, ", cuBLAS ",
                         cuda.cublas_version, ", NCCL ", cuda.nccl_version, "; ", mpi_text, "; HDF5 ", h5_major, ".",
                         h5_minor, ".", h5_release, "; ", blas, "; oneDNN ", dnnl->major, ".", dnnl->minor, ".",
                         dnnl->patch);
}

std::string host_report(const comm::World& world) {
  const CudaStatus& cuda = cuda_status();
  const double mem_kb = std::atof(first_line_with("/proc/meminfo", "MemTotal").c_str());
  std::string text = detail::str_cat("host ", world.host(), ": ", first_line_with("/proc/cpuinfo", "model name"), ", ",
                                     sysconf(_SC_NPROCESSORS_ONLN), " cores online (", available_cores(),
                                     " usable by rank ", world.rank(), "), ",
                                     format_bytes(static_cast<int64_t>(mem_kb * 1024)), " memory; ");
  if (cuda.device_count == 0) text += detail::str_cat("no CUDA device (", cuda.reason, ")");
  for (const auto& d : cuda.devices)
    text += detail::str_cat("cuda:", d.index, " ", d.name, " ", format_bytes(d.total_memory_bytes), " cc ",
                            d.compute_major, ".", d.compute_minor, " driver ",
                            version_text(cuda.driver_version, 1000, 10, 100), "; ");
  return text;
}

// One check: every rank reports "" (pass) or a reason; rank 0 prints PASS/FAIL naming failing ranks.
bool report(const comm::World& world, const std::string& name, const std::string& local_failure,
            const std::string& pass_detail) {
  const auto all = comm::gather_strings(world.comm(), local_failure);
  int ok = local_failure.empty() ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world.comm()));
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
  return ok != 0;
}

int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = std::stod(text, &used);
  const std::string suffix = text.substr(used);
  if (suffix == "K") v *= 1024;
  else if (suffix == "M") v *= 1024 * 1024;
  else if (suffix == "G") v *= 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) RT_THROW("--bytes: unknown size suffix '", suffix, "' in '", text, "' (use K, M or G)");
  return static_cast<int64_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringtrain's preflight doctor: machine, libraries, rank map and checks (alone or under mpirun)"};
  std::string data_dir, bytes_text = "16M";
  app.add_option("--data", data_dir, "also validate every split of this shard folder");
  app.add_option("--bytes", bytes_text, "all-reduce size for the timed check (K/M/G suffixes)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return comm::run_main(argc, argv, [&](comm::World& world) {
    const int64_t bytes = parse_bytes(bytes_text);
    // The thread count a training rank would get.
    const comm::DeviceBinding cpu = world.bind(Device::cpu());
    const CudaStatus& cuda = cuda_status();

    // ---- facts
    const auto hosts = comm::gather_strings(world.comm(), world.local_rank() == 0 ? host_report(world) : "");
    std::string versions = library_versions();
    if (const char* fake = std::getenv("RINGTRAIN_FAKE_BUILD")) versions += detail::str_cat(" [", fake, "]");  // tests
    const std::string device = cuda.device_count > 0 ? Device::cuda(world.local_rank() % cuda.device_count).str() : "cpu";
    const auto map = comm::gather_strings(world.comm(), detail::str_cat(world.host(), " -> ", device, ", ", cpu.threads, " CPU threads"));
    if (world.is_root()) {
      std::printf("%s\n", versions.c_str());
      std::printf("cpu: %d threads for this process (%d cores available, %d local ranks)\n", num_threads(),
                  available_cores(), world.local_size());
      for (const auto& h : hosts)
        if (!h.empty()) std::printf("%s\n", h.c_str());
      for (int r = 0; r < world.size(); ++r) std::printf("rank %d: %s\n", r, map[r].c_str());
      std::fflush(stdout);
    }

    // ---- checks
    bool all_ok = true;
    std::string differs;
    {
      std::vector<char> root(versions.begin(), versions.end());
      int n = static_cast<int>(root.size());
      MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT, 0, world.comm()));
      root.resize(static_cast<size_t>(n));
      MPI_CHECK(MPI_Bcast(root.data(), n, MPI_CHAR, 0, world.comm()));
      const std::string rank0(root.begin(), root.end());
      if (rank0 != versions) differs = "runs '" + versions + "' but rank 0 runs '" + rank0 + "'";
    }
    all_ok &= report(world, "same build", differs, detail::str_cat("all ", world.size(), " rank(s) run the same build and libraries"));

    std::vector<Device> devices{Device::cpu()};
    for (int i = 0; i < cuda.device_count; ++i) devices.push_back(Device::cuda(i));
    for (Device d : devices) {
      std::string failure, detail_text;
      try {
        auto [first, last] = self_test(d);
        if (!(last < first * 0.8)) failure = detail::str_cat("MLP loss did not drop (", first, " -> ", last, ")");
        detail_text = detail::str_cat("MLP loss ", first, " -> ", last, " after 20 SGD steps");
      } catch (const std::exception& e) {
        failure = e.what();
      }
      if (world.is_root() && failure.empty())  // the line the CLI test and users grep for
        std::printf("self-test on %s: %s: ok\n", d.str().c_str(), detail_text.c_str());
      all_ok &= report(world, "self-test on " + d.str(), failure, "every rank");
    }

    std::vector<comm::Backend> backends{comm::Backend::Ring, comm::Backend::Mpi};
    if (cuda.device_count > 0 && cuda.device_count >= world.local_size()) backends.push_back(comm::Backend::Nccl);
    for (comm::Backend b : backends) {
      std::string failure;
      double busbw = 0;
      try {
        const Device dev = b == comm::Backend::Nccl ? Device::cuda(world.local_rank() % cuda.device_count) : Device::cpu();
        if (dev.is_cuda()) set_current_device(dev);
        auto comm = comm::make_communicator(b, world.comm());
        const int64_t count = std::max<int64_t>(1, bytes / 4);
        Tensor t = Tensor::full(Shape{count}, world.rank() + 1.0, DType::F32, dev);
        comm->all_reduce(t);  // warm-up, and the value to check
        const double expect = world.size() * (world.size() + 1) / 2.0;
        const float got = t.to(Device::cpu()).data<float>()[count - 1];
        if (got != expect) failure = detail::str_cat("result ", got, ", expected ", expect);
        comm->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 5; ++i) comm->all_reduce(t);
        synchronize(dev);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 5;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, world.comm()));
        busbw = static_cast<double>(count * 4) / s / 1e9 * 2.0 * (world.size() - 1) / world.size();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      all_ok &= report(world, detail::str_cat(comm::backend_name(b), " all-reduce"), failure,
                       detail::str_cat(format_bytes(bytes), " correct, busbw ", busbw, " GB/s"));
    }

    if (!data_dir.empty()) {
      std::string failure, detail_text;
      try {
        for (const auto& split : data::read_manifest(data_dir)) {
          auto ds = data::ShardDataset::open(data_dir, split.split);
          detail_text += detail::str_cat(split.split, " (", ds.size(), " records, ", split.shards.size(), " shards) ");
        }
      } catch (const std::exception& e) {
        failure = e.what();
      }
      all_ok &= report(world, "data " + data_dir, failure, detail_text + "valid");
    }
    int ok = all_ok ? 1 : 0;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world.comm()));
    if (world.is_root()) std::printf("%s\n", ok ? "all checks passed" : "some checks FAILED");
    return ok ? 0 : 1;
  });
}
