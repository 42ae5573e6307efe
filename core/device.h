// core/device.h: Device (CPU or CUDA:i), CUDA device detection, and Stream / Event wrappers.
// Detection never crashes: a machine with the toolkit but no GPU or no driver answers "no CUDA device"
// with the runtime's reason. The CUDA implementation is core/cuda/device.cpp; builds without CUDA
// compile core/device_nocuda.cpp instead (CMake picks the file, no #ifdef).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace ringtrain {

class Tensor;

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};
std::ostream& operator<<(std::ostream& os, const Device& d);

// Parses "cpu", "cuda", "cuda:1"; throws ringtrain::Error naming the text otherwise.
Device parse_device(std::string_view text);

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int64_t total_memory_bytes = 0;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  std::string pci_bus_id;  // "0000:65:00.0": how NVML (GPU telemetry) finds the same device
};

struct CudaStatus {
  bool built_with_cuda = false;
  int device_count = 0;
  int driver_version = 0;   // e.g. 13000; 0 when no driver
  int runtime_version = 0;  // e.g. 13000; 0 without CUDA
  int cudnn_version = 0;    // cudnnGetVersion(), e.g. 91300; 0 without CUDA
  int cublas_version = 0;   // cublasGetProperty-based, e.g. 130000
  int nccl_version = 0;     // ncclGetVersion(), e.g. 22800
  std::string reason;       // why device_count is 0, e.g. "CUDA driver version is insufficient..."
  std::vector<CudaDeviceInfo> devices;
};

// Queried once and cached; safe to call from any thread.
const CudaStatus& cuda_status();
int cuda_device_count();
// The cuDNN convolution algorithms chosen so far in this process, one line per pass and shape (empty
// without CUDA or before the first GPU convolution).
std::vector<std::string> cuda_conv_algorithms();
bool cuda_available();
// Free memory on CUDA device `d` now (cudaMemGetInfo), in bytes. Errors name the device.
int64_t cuda_free_memory_bytes(Device d);

// Sets the calling thread's current CUDA device (no-op for CPU). Errors name the device.
void set_current_device(Device d);

// A CUDA stream. The default-constructed Stream is the legacy default stream. Streams are ordered
// with Events: record on the producer, wait on the consumer.
class Stream {
 public:
  Stream() = default;
  static Stream create(Device device);                                 // a new non-blocking stream on `device`
  void* handle() const { return handle_.get() ? *handle_ : nullptr; }  // cudaStream_t
  Device device() const { return device_; }
  void synchronize() const;
  bool operator==(const Stream& o) const { return handle() == o.handle(); }

 private:
  std::shared_ptr<void*> handle_;
  Device device_ = Device::cuda(0);
};

class Event {
 public:
  static Event create(Device device, bool timing = false);
  void record(const Stream& s);
  void wait_on(const Stream& s) const;  // s waits until this event completes
  void synchronize() const;
  // True once the work queued before the last record() has finished (cudaEventQuery): never waits, and
  // is not one of cuda_host_syncs(). True for an event never recorded.
  bool query() const;
  float elapsed_ms_since(const Event& start) const;
  void* handle() const { return handle_ ? *handle_ : nullptr; }

 private:
  std::shared_ptr<void*> handle_;
};

// A piece of GPU work (a training step) captured once as a CUDA Graph and replayed: one launch instead of
// one per kernel, and none of the host work between them. The work runs on a stream of the graph's own,
// so the caching allocator (which caches blocks per stream) keeps every block the capture allocated for
// the graph alone: the addresses baked into the graph stay valid and no other work is handed them.
// Whatever the work reads that it did not allocate (parameters, optimizer state, inputs) must stay
// allocated and be updated in place between replays; values the host passed to kernels (a learning rate,
// a seed) are baked in. A check deferred during the capture (cross_entropy's labels) belongs to the graph:
// each replay defers it again, on copies of its evidence taken after that replay, so every replay is
// checked with what it left, however many replays run before the host reads.
class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  // Runs `work` once on the graph's stream (current for it) under stream capture: its GPU work is recorded,
  // not run, and the graph instantiated. Returns "" when the graph is ready, else why not: no CUDA device,
  // what `work` threw (e.g. a host wait, which capture forbids), or the CUDA error that ended the capture.
  // `work`'s host-side effects happen either way. Work queued on `device` before is waited for first.
  std::string capture(Device device, const std::function<void()>& work);
  // Runs the captured work: after what is queued on the calling thread's current stream, and before what
  // is queued there next. Throws if nothing was captured.
  void replay();
  bool ready() const;
  // The captured graph's memory nodes (allocations and frees inside the graph): 0 for a step whose memory
  // comes from the caching allocator and whose libraries (cuBLAS: its own workspace) allocate nothing lazily.
  // 0 when nothing is captured or the graph is emulated.
  int64_t memory_nodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::function<void()> emulated_;  // cuda_graph_emulated() on the CPU: the work each replay runs again
};

// RINGTRAIN_CUDA_GRAPH_EMULATE=1, for tests without a GPU: a CudaGraph "captures" work on the CPU by keeping
// it (nothing runs) and each replay runs it again, so what drives a graph (runtime/loop/trainer.cpp's
// --cuda-graph) is tested on the CPU. It proves nothing about the GPU's capture itself.
bool cuda_graph_emulated();

// The stream CUDA kernels of the calling thread are launched on (default: legacy default stream).
Stream current_stream();
void set_current_stream(const Stream& s);

// Waits for all work on `d` (no-op for CPU).
void synchronize(Device d);

// The host's waits for the GPU in this process so far: stream, event and device synchronisations, and the
// copies that end in one (the host reading device data, or a copy between devices). A device-to-device
// copy on one GPU is ordered on the stream and waits for nothing. Always 0 without CUDA. The profiler
// (runtime/telemetry/profiler.h) reports it per step; a steady training step's ops make none between log
// points (the Trainer's one wait a step, for the step before it, is on an event already done under --profile).
int64_t cuda_host_syncs();

// Checks whose evidence lives on the device (cross_entropy's label check): recorded without a host wait,
// run at the next host read of device data (Tensor::item(), to_vector(), .to(cpu)), which waits anyway.
// `check` reads its device flags and throws the error it describes. RINGTRAIN_CUDA_SYNC=1 runs each at
// once, like the op errors. At most kMaxDeferredChecks wait; one more runs them all first.
// `evidence`: the device tensors the check reads, handed to it when it runs, with the stream current at the
// deferral current again (reads ordered after the kernels that wrote them). Under a CudaGraph's capture
// the check goes to the graph instead (see CudaGraph).
constexpr size_t kMaxDeferredChecks = 256;
using DeviceCheck = std::function<void(const std::vector<Tensor>& evidence)>;
void defer_device_check(std::vector<Tensor> evidence, DeviceCheck check);
// Runs (and forgets) every deferred check, in the order they were made; the first that fails throws.
void run_deferred_checks();
size_t deferred_checks_pending();

namespace detail {
void count_host_sync();
// RINGTRAIN_CUDA_SYNC=1: every CUDA op synchronizes its stream and checks for errors, so a fault is reported
// against the op that caused it (ops recorded by a CUDA graph's capture cannot wait: each replay of the graph
// synchronizes instead). Unset, empty or 0: off; any other value is an error naming the variable.
bool cuda_sync_every_op();
// A check deferred, with what it reads and the stream its reads go on.
struct DeferredCheck {
  std::vector<Tensor> evidence;
  DeviceCheck check;
  Stream stream;
};
// While a CudaGraph captures on this thread, the checks deferred go to `sink` (null: the usual list).
void set_capture_sink(std::vector<DeferredCheck>* sink);
}  // namespace detail

}  // namespace ringtrain
