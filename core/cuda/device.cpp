// core/cuda/device.cpp: the CUDA implementation of core/device.h (detection, current device, Stream,
// Event, current stream) and the CUDA parts of core/allocator.h (the cudaMalloc backend under one
// CachingAllocator per device, device copies). Also the status -> text helpers of cuda_check.h.
// Compiled by the host C++ compiler; builds without CUDA compile core/device_nocuda.cpp instead.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <library_types.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/device_guard.h"
#include "core/device.h"
#include "core/tensor.h"

namespace ringtrain {

// ---------------------------------------------------------------------------------------------------
// Status -> text

namespace cuda_detail {

const char* cuda_error_text(cudaError_t status) noexcept { return cudaGetErrorString(status); }

const char* cublas_error_text(cublasStatus_t status) noexcept {
  // Our own table so that the text does not depend on the cuBLAS version's wording.
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED (cuBLAS library not initialized)";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED (resource allocation failed)";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE (an invalid numeric value was used)";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH (feature absent from the device architecture)";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR (access to GPU memory space failed)";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED (GPU program failed to execute)";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR (an internal cuBLAS operation failed)";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED (functionality not supported)";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

const char* cudnn_error_text(cudnnStatus_t status) noexcept { return cudnnGetErrorString(status); }

const char* nccl_error_text(ncclResult_t status) noexcept { return ncclGetErrorString(status); }

int current_device_or_none() noexcept {
  int device = detail::kNoDevice;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // clear it: reporting an error must not leave a new one behind
    return detail::kNoDevice;
  }
  return device;
}

}  // namespace cuda_detail

namespace {

// At process exit the runtime may already be unloaded when a leaked or static handle is released;
// the resource is gone with it, so that is not worth a message.
cudaError_t ignore_unloading(cudaError_t status) { return status == cudaErrorCudartUnloading ? cudaSuccess : status; }

void check_device_index(Device d, const char* what) {
  const CudaStatus& status = cuda_status();
  if (d.index < 0 || d.index >= status.device_count) {
    RT_THROW(what, ": no such device ", d.str(), " (", status.device_count, " CUDA device(s) visible",
             status.reason.empty() ? std::string() : "; " + status.reason, ")");
  }
}

// DeviceGuard (core/cuda/device_guard.h) for a checked device.
struct CheckedDeviceGuard {
  explicit CheckedDeviceGuard(Device d) : guard((check_device_index(d, "DeviceGuard"), d.index)) {}
  DeviceGuard guard;
};

CudaStatus query_cuda_status() {
  CudaStatus status;
  status.built_with_cuda = true;
  // Library versions need no device; calling them also guarantees the build really links cuDNN,
  // cuBLAS and NCCL.
  if (cudaRuntimeGetVersion(&status.runtime_version) != cudaSuccess) status.runtime_version = 0;
  if (cudaDriverGetVersion(&status.driver_version) != cudaSuccess) status.driver_version = 0;
  status.cudnn_version = static_cast<int>(cudnnGetVersion());
  if (ncclGetVersion(&status.nccl_version) != ncclSuccess) status.nccl_version = 0;
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    status.cublas_version = major * 10000 + minor * 100 + patch;
  }

  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // e.g. cudaErrorInsufficientDriver / cudaErrorNoDevice on a machine with the toolkit but no GPU.
    status.device_count = 0;
    status.reason = cudaGetErrorString(error);
    cudaGetLastError();  // clear it so the next checked call does not report it
    return status;
  }
  status.device_count = count;
  if (count == 0) status.reason = "no CUDA device found";
  for (int i = 0; i < count; ++i) {
    CudaDeviceInfo info;
    info.index = i;
    cudaDeviceProp prop{};
    cudaError_t prop_error = cudaGetDeviceProperties(&prop, i);
    if (prop_error == cudaSuccess) {
      info.name = prop.name;
      info.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
      info.compute_major = prop.major;
      info.compute_minor = prop.minor;
      info.multiprocessors = prop.multiProcessorCount;
      char bus_id[32] = {0};
      if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, i) == cudaSuccess) info.pci_bus_id = bus_id;
      cudaGetLastError();
    } else {
      info.name = std::string("<properties unavailable: ") + cudaGetErrorString(prop_error) + ">";
      cudaGetLastError();
    }
    status.devices.push_back(std::move(info));
  }
  return status;
}

// The calling thread's stream; default-constructed = the legacy default stream.
thread_local Stream t_current_stream;

cudaStream_t as_stream(void* handle) { return static_cast<cudaStream_t>(handle); }
cudaEvent_t as_event(void* handle) { return static_cast<cudaEvent_t>(handle); }

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Detection and current device

const CudaStatus& cuda_status() {
  static const CudaStatus status = query_cuda_status();
  return status;
}

int cuda_device_count() { return cuda_status().device_count; }

bool cuda_available() { return cuda_status().device_count > 0; }

int64_t cuda_free_memory_bytes(Device d) {
  RT_CHECK(d.is_cuda(), "cuda_free_memory_bytes: ", d.str(), " is not a CUDA device");
  CheckedDeviceGuard guard(d);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

void set_current_device(Device d) {
  if (d.is_cpu()) return;
  check_device_index(d, "set_current_device");
  CUDA_CHECK(cudaSetDevice(d.index));
}

// ---------------------------------------------------------------------------------------------------
// Stream and Event

Stream Stream::create(Device device) {
  RT_CHECK(device.is_cuda(), "Stream::create: streams exist only on CUDA devices, not on ", device.str());
  CheckedDeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Stream result;
  result.handle_ = std::shared_ptr<void*>(new void*(stream), [](void** handle) {
    CUDA_CHECK_NOTHROW(ignore_unloading(cudaStreamDestroy(as_stream(*handle))));
    delete handle;
  });
  result.device_ = device;
  return result;
}

void Stream::synchronize() const {
  detail::count_host_sync();
  CUDA_CHECK(cudaStreamSynchronize(as_stream(handle())));
}

Event Event::create(Device device, bool timing) {
  RT_CHECK(device.is_cuda(), "Event::create: events exist only on CUDA devices, not on ", device.str());
  CheckedDeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  Event result;
  result.handle_ = std::shared_ptr<void*>(new void*(event), [](void** handle) {
    CUDA_CHECK_NOTHROW(ignore_unloading(cudaEventDestroy(as_event(*handle))));
    delete handle;
  });
  return result;
}

void Event::record(const Stream& s) {
  RT_CHECK(handle() != nullptr, "Event::record on an event that was not made by Event::create");
  CUDA_CHECK(cudaEventRecord(as_event(handle()), as_stream(s.handle())));
}

void Event::wait_on(const Stream& s) const {
  RT_CHECK(handle() != nullptr, "Event::wait_on on an event that was not made by Event::create");
  CUDA_CHECK(cudaStreamWaitEvent(as_stream(s.handle()), as_event(handle()), 0));
}

void Event::synchronize() const {
  RT_CHECK(handle() != nullptr, "Event::synchronize on an event that was not made by Event::create");
  detail::count_host_sync();
  CUDA_CHECK(cudaEventSynchronize(as_event(handle())));
}

bool Event::query() const {
  RT_CHECK(handle() != nullptr, "Event::query on an event that was not made by Event::create");
  const cudaError_t status = cudaEventQuery(as_event(handle()));
  if (status == cudaErrorNotReady) return false;
  CUDA_CHECK(status);
  return true;
}

float Event::elapsed_ms_since(const Event& start) const {
  RT_CHECK(handle() != nullptr && start.handle() != nullptr,
           "Event::elapsed_ms_since needs two events made by Event::create(device, /*timing=*/true)");
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, as_event(start.handle()), as_event(handle())));
  return ms;
}

// ---------------------------------------------------------------------------------------------------
// CUDA graphs

struct CudaGraph::Impl {
  Device device = Device::cpu();
  Stream stream;                // the graph's own: its blocks stay in the allocator's cache for it
  Event before, after;          // replay: the caller's stream -> the graph's stream -> the caller's
  cudaGraph_t graph = nullptr;  // as captured
  cudaGraphExec_t exec = nullptr;
  std::vector<detail::DeferredCheck> checks;  // deferred during the capture: deferred again by each replay
  bool held = false;  // the allocator keeps the stream's cached blocks (the replays write into them)
  ~Impl() {
    // Replays still running own blocks that the allocator would hand out again under this stream's key.
    if (stream.handle()) CUDA_CHECK_NOTHROW(ignore_unloading(cudaStreamSynchronize(as_stream(stream.handle()))));
    if (exec) CUDA_CHECK_NOTHROW(ignore_unloading(cudaGraphExecDestroy(exec)));
    if (graph) CUDA_CHECK_NOTHROW(ignore_unloading(cudaGraphDestroy(graph)));
    release();
  }
  // The stream's cached blocks may go back to the device (empty_cache, an out-of-memory retry) from now on.
  void release() noexcept {
    if (!held) return;
    held = false;
    try {
      cuda_allocator(device.index).release_stream(stream.handle());
    } catch (...) {  // a destructor: the blocks then stay cached, which is safe
    }
  }
};

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}
CudaGraph::~CudaGraph() = default;

bool CudaGraph::ready() const { return impl_->exec != nullptr || emulated_; }

int64_t CudaGraph::memory_nodes() const {
  if (!impl_->graph) return 0;
  size_t count = 0;
  CUDA_CHECK(cudaGraphGetNodes(impl_->graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CUDA_CHECK(cudaGraphGetNodes(impl_->graph, nodes.data(), &count));
  int64_t memory = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    memory += type == cudaGraphNodeTypeMemAlloc || type == cudaGraphNodeTypeMemFree ? 1 : 0;
  }
  return memory;
}

std::string CudaGraph::capture(Device device, const std::function<void()>& work) {
  RT_CHECK(!ready(), "CudaGraph::capture: this graph holds a capture already");
  if (device.is_cpu() && cuda_graph_emulated()) {
    emulated_ = work;
    return "";
  }
  if (!device.is_cuda()) return "a CUDA graph needs a CUDA device, not " + device.str();
  synchronize(device);  // the work queued before has run: nothing the capture orders after is pending
  Impl& g = *impl_;
  g.device = device;
  g.stream = Stream::create(device);
  g.before = Event::create(device);
  g.after = Event::create(device);
  const cudaStream_t stream = as_stream(g.stream.handle());
  // Every block the capture allocates and frees again stays cached under this stream for the replays:
  // held, it is not given back by empty_cache or an out-of-memory retry while the graph lives.
  cuda_allocator(device.index).hold_stream(g.stream.handle());
  g.held = true;
  const Stream caller = current_stream();
  set_current_stream(g.stream);
  std::string why;
  cudaError_t status = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (status != cudaSuccess) {
    why = std::string("cudaStreamBeginCapture failed: ") + cudaGetErrorString(status);
  } else {
    struct Sink {  // the checks the work defers are the graph's (reset also when it throws)
      explicit Sink(std::vector<detail::DeferredCheck>* s) { detail::set_capture_sink(s); }
      ~Sink() { detail::set_capture_sink(nullptr); }
    };
    try {
      Sink sink(&g.checks);
      work();
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
      why = "the captured work threw an exception that is not a std::exception";
    }
    cudaGraph_t graph = nullptr;
    status = cudaStreamEndCapture(stream, &graph);  // always ended, so the stream is usable again
    if (why.empty() && status != cudaSuccess)
      why = std::string("the capture ended with ") + cudaGetErrorString(status) +
            " (a call the capture does not allow, such as a host wait or a host-to-device copy from pageable "
            "memory)";
    if (why.empty()) {
      status = cudaGraphInstantiate(&g.exec, graph, 0);
      if (status != cudaSuccess) {
        why = std::string("cudaGraphInstantiate failed: ") + cudaGetErrorString(status);
        g.exec = nullptr;
      }
    }
    if (graph && why.empty())
      g.graph = graph;
    else if (graph)
      CUDA_CHECK_NOTHROW(cudaGraphDestroy(graph));
  }
  set_current_stream(caller);
  if (!why.empty()) {
    (void)cudaGetLastError();  // a failed capture's error is not the next kernel's
    g.checks.clear();
    g.release();  // nothing will replay: what the capture cached may go back to the device
  }
  return why;
}

void CudaGraph::replay() {
  RT_CHECK(ready(), "CudaGraph::replay: nothing was captured");
  if (emulated_) {
    emulated_();
    return;
  }
  Impl& g = *impl_;
  CheckedDeviceGuard guard(g.device);
  const Stream caller = current_stream();
  g.before.record(caller);
  g.before.wait_on(g.stream);
  CUDA_CHECK(cudaGraphLaunch(g.exec, as_stream(g.stream.handle())));
  g.after.record(g.stream);
  g.after.wait_on(caller);
  if (detail::cuda_sync_every_op()) {  // the replay's ops did not wait when they were captured: the replay does
    detail::count_host_sync();
    cudaError_t status = cudaStreamSynchronize(as_stream(g.stream.handle()));
    if (status == cudaSuccess) status = cudaGetLastError();
    if (status != cudaSuccess)
      RT_THROW("CUDA error in a CUDA graph's replay: ", cudaGetErrorString(status), " (", cudaGetErrorName(status),
               ", found by synchronizing after the replay because RINGTRAIN_CUDA_SYNC=1)");
  }
  // The capture's checks, on copies of what this replay left (the next replay overwrites the originals),
  // made on the caller's stream after the replay and read there.
  for (const detail::DeferredCheck& c : g.checks) {
    std::vector<Tensor> copies;
    copies.reserve(c.evidence.size());
    for (const Tensor& e : c.evidence) copies.push_back(e.detach().clone());
    defer_device_check(std::move(copies), c.check);
  }
}

Stream current_stream() { return t_current_stream; }

void set_current_stream(const Stream& s) { t_current_stream = s; }

void synchronize(Device d) {
  if (d.is_cpu()) return;
  CheckedDeviceGuard guard(d);
  detail::count_host_sync();
  CUDA_CHECK(cudaDeviceSynchronize());
}

// ---------------------------------------------------------------------------------------------------
// Allocation and copies

namespace {

class CudaBackend final : public RawBackend {
 public:
  explicit CudaBackend(int index) : index_(index) {}

  void* raw_allocate(int64_t nbytes) override {
    CheckedDeviceGuard guard(Device::cuda(index_));
    void* ptr = nullptr;
    // Under a CudaGraph's capture the block belongs to the graph's stream for good (the cache is per
    // stream), so allocating it outside the capture's view is safe: relaxed mode allows the call.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaError_t status = cudaMalloc(&ptr, static_cast<size_t>(nbytes));
    CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky, but clear it so after_op does not blame the next kernel
      return nullptr;
    }
    if (status != cudaSuccess) {
      detail::raise_call_error("CUDA", static_cast<long long>(status), cudaGetErrorString(status),
                               "cudaMalloc(&ptr, nbytes)", __FILE__, __LINE__, index_);
    }
    return ptr;
  }

  bool raw_free(void* ptr) noexcept override {
    // cudaFree finds the owning device from the pointer (unified addressing); no device switch needed. Under a
    // CudaGraph's capture (an out-of-memory retry gives the cache back) relaxed mode allows it, as cudaMalloc:
    // in the capture's own mode the call would end the capture.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) return false;
    const cudaError_t status = ignore_unloading(cudaFree(ptr));
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    CUDA_CHECK_NOTHROW(status);
    return status == cudaSuccess;
  }

  int64_t device_total_bytes() const override {
    const CudaStatus& status = cuda_status();
    if (index_ < 0 || index_ >= static_cast<int>(status.devices.size())) return 0;
    return status.devices[static_cast<size_t>(index_)].total_memory_bytes;
  }

  std::string device_name() const override { return Device::cuda(index_).str(); }

 private:
  int index_;
};

}  // namespace

CachingAllocator& cuda_allocator(int index) {
  // One allocator per visible device, made on first use and never destroyed: tensors held in statics
  // may be freed during static destruction, after any allocator we could destroy.
  static const std::vector<CachingAllocator*>* const allocators = [] {
    auto* list = new std::vector<CachingAllocator*>();
    for (int i = 0; i < cuda_device_count(); ++i)
      list->push_back(new CachingAllocator(std::make_unique<CudaBackend>(i)));
    return list;
  }();
  if (index < 0 || index >= static_cast<int>(allocators->size())) {
    const CudaStatus& status = cuda_status();
    RT_THROW("cuda_allocator: no such device cuda:", index, " (", status.device_count, " CUDA device(s) visible",
             status.reason.empty() ? std::string() : "; " + status.reason, ")");
  }
  return *(*allocators)[static_cast<size_t>(index)];
}

namespace detail {

void* cuda_allocate(int device_index, int64_t nbytes) {
  return cuda_allocator(device_index).allocate(nbytes, current_stream().handle());
}

void cuda_free(int device_index, void* ptr) noexcept {
  try {
    cuda_allocator(device_index).free(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringtrain: freeing CUDA memory on cuda:%d failed (ignored): %s\n", device_index, e.what());
  } catch (...) {
    std::fprintf(stderr, "ringtrain: freeing CUDA memory on cuda:%d failed (ignored)\n", device_index);
  }
}

void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes) {
  if (nbytes == 0) return;
  RT_CHECK(dst_device.is_cuda() || src_device.is_cuda(), "cuda_copy_bytes: neither side is a CUDA device (",
           src_device.str(), " -> ", dst_device.str(), ")");
  // The copy goes on the current stream (ordered after the kernels that produced src) when that stream
  // lives on one of the two devices; otherwise on the legacy default stream of the CUDA side.
  const Stream current = current_stream();
  const bool use_current =
      current.handle() != nullptr && (current.device() == dst_device || current.device() == src_device);
  // Within one GPU the copy is ordered after the kernels that made src when it goes on the stream they
  // ran on: the current stream, or the legacy default stream of the current device.
  int device_now = -1;
  if (!use_current && current.handle() == nullptr) CUDA_CHECK(cudaGetDevice(&device_now));
  const bool stream_ordered =
      dst_device == src_device && (use_current || (device_now >= 0 && device_now == dst_device.index));
  CheckedDeviceGuard guard(use_current ? current.device() : dst_device.is_cuda() ? dst_device : src_device);
  cudaStream_t stream = use_current ? as_stream(current.handle()) : nullptr;
  // cudaMemcpyDefault: unified addressing tells host, device and peer pointers apart.
  CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(nbytes), cudaMemcpyDefault, stream));
  // A copy within one GPU on the current stream is ordered like a kernel: whatever reads dst later on this
  // stream sees it, and the host need not wait (batch norm's running statistics take this path every step).
  // The host must wait when it reads or writes host memory (its buffer may go away after the return) and
  // for a copy between GPUs.
  if (stream_ordered) return;
  detail::count_host_sync();
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

void cuda_copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes,
                           const Stream& stream) {
  if (nbytes == 0) return;
  CheckedDeviceGuard guard(dst_device.is_cuda() ? dst_device : src_device);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(nbytes), cudaMemcpyDefault, as_stream(stream.handle())));
}

void* cuda_host_allocate(int64_t nbytes) {
  void* ptr = nullptr;
  // Portable: usable from every device's streams; page-locked so copies run asynchronously at full speed.
  const cudaError_t status =
      cudaHostAlloc(&ptr, static_cast<size_t>(std::max<int64_t>(nbytes, 1)), cudaHostAllocPortable);
  if (status != cudaSuccess) {
    cudaGetLastError();
    RT_THROW("cannot allocate ", format_bytes(nbytes), " of pinned host memory: ", cudaGetErrorString(status),
             " (lower the loader's prefetch or batch size)");
  }
  return ptr;
}

void cuda_host_free(void* ptr) noexcept { CUDA_CHECK_NOTHROW(cudaFreeHost(ptr)); }

}  // namespace detail
}  // namespace ringtrain
