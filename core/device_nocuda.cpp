// core/device_nocuda.cpp: the build-without-CUDA counterpart of core/cuda/device.cpp and
// core/cuda/table.cpp. CPU requests work as usual; every CUDA request fails with one error that says
// why (never a silent CPU fallback). CMake compiles this file instead of the CUDA sources.
#include <string>

#include "core/allocator.h"
#include "core/check.h"
#include "core/device.h"
#include "core/kernels.h"

namespace ringtrain {
namespace {

constexpr const char* kNoCudaReason =
    "ringtrain was built without CUDA (RINGTRAIN_CUDA=OFF or CUDA not found at configure time)";

[[noreturn]] void raise_no_cuda(const std::string& what) { RT_THROW(what, ": ", kNoCudaReason); }

}  // namespace

const CudaStatus& cuda_status() {
  static const CudaStatus status = [] {
    CudaStatus s;
    s.built_with_cuda = false;
    s.device_count = 0;
    s.reason = kNoCudaReason;
    return s;
  }();
  return status;
}

int cuda_device_count() { return 0; }
std::vector<std::string> cuda_conv_algorithms() { return {}; }

bool cuda_available() { return false; }

int64_t cuda_free_memory_bytes(Device d) { raise_no_cuda("cannot query the free memory of " + d.str()); }

void set_current_device(Device d) {
  if (d.is_cpu()) return;
  raise_no_cuda("cannot use " + d.str());
}

Stream Stream::create(Device device) { raise_no_cuda("Stream::create(" + device.str() + ")"); }

void Stream::synchronize() const { raise_no_cuda("Stream::synchronize"); }

Event Event::create(Device device, bool /*timing*/) { raise_no_cuda("Event::create(" + device.str() + ")"); }

void Event::record(const Stream& /*s*/) { raise_no_cuda("Event::record"); }

void Event::wait_on(const Stream& /*s*/) const { raise_no_cuda("Event::wait_on"); }

void Event::synchronize() const { raise_no_cuda("Event::synchronize"); }

bool Event::query() const { raise_no_cuda("Event::query"); }

float Event::elapsed_ms_since(const Event& /*start*/) const { raise_no_cuda("Event::elapsed_ms_since"); }

struct CudaGraph::Impl {};
CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}
CudaGraph::~CudaGraph() = default;
bool CudaGraph::ready() const { return static_cast<bool>(emulated_); }
int64_t CudaGraph::memory_nodes() const { return 0; }
std::string CudaGraph::capture(Device device, const std::function<void()>& work) {
  RT_CHECK(!ready(), "CudaGraph::capture: this graph holds a capture already");
  if (device.is_cpu() && cuda_graph_emulated()) {
    emulated_ = work;
    return "";
  }
  return "this build of ringtrain has no CUDA (a CUDA graph needs a CUDA device; asked for " + device.str() + ")";
}
void CudaGraph::replay() {
  if (!emulated_) raise_no_cuda("CudaGraph::replay");
  emulated_();
}

Stream current_stream() { return Stream(); }

void set_current_stream(const Stream& s) {
  // Only the default stream exists without CUDA; anything else could not have been created.
  if (s.handle() != nullptr) raise_no_cuda("set_current_stream");
}

void synchronize(Device d) {
  if (d.is_cpu()) return;
  raise_no_cuda("synchronize(" + d.str() + ")");
}

CachingAllocator& cuda_allocator(int index) { raise_no_cuda("cuda_allocator(cuda:" + std::to_string(index) + ")"); }

namespace detail {

void* cuda_allocate(int device_index, int64_t /*nbytes*/) {
  raise_no_cuda("cannot allocate on cuda:" + std::to_string(device_index));
}

// Nothing can have been allocated on a CUDA device, so there is nothing to free.
void cuda_free(int /*device_index*/, void* /*ptr*/) noexcept {}

void cuda_copy_bytes(void* /*dst*/, Device dst_device, const void* /*src*/, Device src_device, int64_t /*nbytes*/) {
  raise_no_cuda("cannot copy " + src_device.str() + " -> " + dst_device.str());
}

void cuda_copy_bytes_async(void* /*dst*/, Device dst_device, const void* /*src*/, Device src_device, int64_t /*nbytes*/,
                           const Stream& /*stream*/) {
  raise_no_cuda("cannot copy " + src_device.str() + " -> " + dst_device.str());
}

void* cuda_host_allocate(int64_t nbytes) {
  raise_no_cuda("cannot allocate " + std::to_string(nbytes) + " bytes of pinned host memory");
}

void cuda_host_free(void* /*ptr*/) noexcept {}

}  // namespace detail

const KernelTable* cuda_kernels() { return nullptr; }

}  // namespace ringtrain
