// core/allocator.h: memory for tensors. CPU memory is 64-byte aligned; CUDA memory comes from a caching
// allocator (size classes, one free list per stream, statistics, empty_cache, an out-of-memory error
// that tells the user what to do). The caching logic is device-independent (CachingAllocator over a
// RawBackend) so it is tested on the CPU with a fake backend; core/cuda/device.cpp supplies the
// cudaMalloc backend.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/device.h"

namespace ringtrain {

inline constexpr int64_t kCpuAlignment = 64;

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // held by live tensors (rounded sizes)
  int64_t reserved_bytes = 0;        // obtained from the device: allocated + cached
  int64_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes since the last reset
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocations = 0;      // allocate() calls
  int64_t num_cache_hits = 0;       // allocate() calls served from a free list
  int64_t num_raw_allocations = 0;  // calls into the backend (cudaMalloc)
};

// What the caching allocator obtains memory from.
class RawBackend {
 public:
  virtual ~RawBackend() = default;
  // Returns nullptr when the device is out of memory (any other failure throws).
  virtual void* raw_allocate(int64_t nbytes) = 0;
  // false: the device did not take the memory back (the error is printed); the block stays the allocator's,
  // cached and counted as reserved, as it still is.
  virtual bool raw_free(void* ptr) noexcept = 0;
  virtual int64_t device_total_bytes() const = 0;  // 0 if unknown
  virtual std::string device_name() const = 0;     // "cuda:0"
};

// Caches freed blocks by stream and rounded size. Blocks are never split: a request is served by the
// smallest cached block of the same stream whose size is within [rounded, rounded * 5/4].
class CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<RawBackend> backend);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Size class: requests up to 1 MiB round up to 512 B; larger ones to 128 KiB.
  static int64_t round_size(int64_t nbytes);

  void* allocate(int64_t nbytes, void* stream);
  void free(void* ptr);  // back to the free list of the stream it was allocated on
  void empty_cache();    // returns every cached (unused) block to the device, but a held stream's
  // While held (counted: as often released as held), `stream`'s cached blocks stay cached: neither
  // empty_cache nor an out-of-memory retry gives them back. For a CUDA graph (core/device.h CudaGraph), whose
  // replays write into the blocks its capture allocated and freed again under its stream.
  void hold_stream(void* stream);
  void release_stream(void* stream);
  AllocatorStats stats() const;
  void reset_peak();

 private:
  struct Block {
    int64_t size;
    void* stream;
  };
  void release_cached_locked();
  std::unique_ptr<RawBackend> backend_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;                          // ptr -> block in use
  std::map<void*, std::multimap<int64_t, void*>> free_by_stream_;  // stream -> size -> ptr
  std::map<void*, int> held_;                                      // stream -> holds
  AllocatorStats stats_;
};

// A block of device memory shared by a tensor and its views; frees itself when the last owner goes.
class Storage {
 public:
  // pinned: page-locked host memory from cudaHostAlloc (device is the CPU), freed with cudaFreeHost.
  Storage(void* data, int64_t nbytes, Device device, bool pinned = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }
  // Keeps the first `nbytes` (at most nbytes()) and gives the rest back to the heap, the memory staying
  // where it is (CPU memory from the heap; other memory is kept whole). Returns the size now held. For a
  // tensor whose data was compacted in place (core/pack.h); nothing may read past nbytes afterwards.
  int64_t shrink(int64_t nbytes);

 private:
  void* data_;
  int64_t nbytes_;
  Device device_;
  bool pinned_;
};

std::shared_ptr<Storage> allocate_storage(int64_t nbytes, Device device);
// Page-locked host memory, for asynchronous host <-> device copies (needs CUDA; errors otherwise).
std::shared_ptr<Storage> allocate_pinned_storage(int64_t nbytes);

// CPU allocator statistics (allocated / peak); reserved == allocated on the CPU.
AllocatorStats cpu_allocator_stats();
// Whether freed CPU blocks are kept for reuse (glibc's mmap and trim thresholds raised at the first CPU
// allocation): false with RINGTRAIN_MALLOC_DEFAULTS=1, under AddressSanitizer, or where glibc refused.
bool cpu_malloc_reuse();
// The caching allocator of CUDA device `index` (throws when built without CUDA or no such device).
CachingAllocator& cuda_allocator(int index);
AllocatorStats memory_stats(Device device);
// Starts a new high-water mark: peak_allocated_bytes becomes what is allocated now.
void reset_peak_memory(Device device);
// Returns memory no tensor holds to the system: a CUDA device's cached blocks; on the CPU the heap's free
// pages (malloc_trim). For after a large release (a pipeline stage dropping the other stages' weights),
// not for every step: the next allocations page-fault their memory in again.
void empty_cache(Device device);
// Drops what the CPU kernels keep per shape they have seen (their oneDNN primitives and plans, a few MiB
// a model): after a probe whose shapes the run will not use (the layout planner's). Plans in use stay
// alive with their users; the next call of any shape builds its plan again.
void release_kernel_plans();

// Copies bytes between any two devices (synchronous with respect to the host).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes);
// Enqueues a copy involving a CUDA device on `stream` and returns at once: both buffers must stay alive
// (and the host side should be pinned) until an event recorded on `stream` after it has completed.
void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes,
                      const Stream& stream);

// Human-readable byte counts: "512 B", "1.50 MiB".
std::string format_bytes(int64_t nbytes);
// Whether an error message is an allocation that failed: the CPU and device allocators' "... out of memory
// ..." or a std::bad_alloc's "out of host memory" (they state the facts only; what a program's flags can do
// about it is the program's to add).
bool out_of_memory_message(std::string_view message);
// The high-water mark of this process's resident memory (getrusage), in bytes.
double peak_rss_bytes();

namespace detail {
// Provided by core/cuda/*.cpp or core/device_nocuda.cpp.
void* cuda_allocate(int device_index, int64_t nbytes);
void cuda_free(int device_index, void* ptr) noexcept;
void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes);
void cuda_copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes,
                           const Stream& stream);
void* cuda_host_allocate(int64_t nbytes);
void cuda_host_free(void* ptr) noexcept;
}  // namespace detail

}  // namespace ringtrain
