// core/allocator.cpp: CPU aligned allocation, the device-independent caching allocator, Storage.
#include "core/allocator.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/env.h"

namespace ringtrain {

bool out_of_memory_message(std::string_view message) {
  return message.find("out of memory") != std::string_view::npos ||
         message.find("out of host memory") != std::string_view::npos;  // a std::bad_alloc, as main_error says it
}

std::string format_bytes(int64_t nbytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(nbytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  if (unit == 0)
    std::snprintf(buffer, sizeof buffer, "%lld B", static_cast<long long>(nbytes));
  else
    std::snprintf(buffer, sizeof buffer, "%.2f %s", value, units[unit]);
  return buffer;
}

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;  // Linux reports KiB
}

// ---------------------------------------------------------------------------------------------------
// CPU

namespace {
std::atomic<int64_t> g_cpu_allocated{0};
std::atomic<int64_t> g_cpu_peak{0};
std::atomic<int64_t> g_cpu_allocations{0};

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Activations of the same sizes are freed and allocated again every step. By default glibc serves large
// requests with fresh mmaps and gives freed memory at the top of its heap back to the system, so every
// step page-faults (and the kernel zeroes) its activations again: 13% of a 2-thread ResNet-20 step on
// the CPU (docs/PERFORMANCE.md). Keeping requests below 256 MiB in the heap and not trimming it makes
// the second step reuse the first step's pages. RINGTRAIN_MALLOC_DEFAULTS=1 leaves glibc's defaults.
bool tune_malloc() {
#if defined(__SANITIZE_ADDRESS__)
  return false;  // ASan's allocator serves every block; mallopt does not reach it
#else
  if (ringtrain_switch("RINGTRAIN_MALLOC_DEFAULTS")) return false;
  // glibc before 2.35 caps the mmap threshold at 32 MiB: fall back to that.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 256 << 20) == 1 || mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  if (!mmap_ok || !trim_ok)
    std::fprintf(stderr,
                 "ringtrain: glibc refused the malloc thresholds (mmap %s, trim %s): CPU steps will page-fault "
                 "their activations again\n",
                 mmap_ok ? "ok" : "refused", trim_ok ? "ok" : "refused");
  return mmap_ok && trim_ok;
#endif
}

}  // namespace

bool cpu_malloc_reuse() {
  static const bool tuned = tune_malloc();
  return tuned;
}

namespace {

// 64-byte aligned memory from plain malloc, the block's start kept just below the aligned pointer. Not
// aligned_alloc: glibc's memalign asks for size + alignment + a header and gives back what it does not
// use, so a freed block is always too small for the next request of the same size and never reused.
// (Under AddressSanitizer aligned_alloc, which it checks exactly.)
void* aligned_malloc(size_t nbytes) {
#if defined(__SANITIZE_ADDRESS__)
  return std::aligned_alloc(static_cast<size_t>(kCpuAlignment), nbytes);
#else
  constexpr uintptr_t kAlign = static_cast<uintptr_t>(kCpuAlignment);
  void* block = std::malloc(nbytes + 2 * kAlign);
  if (!block) return nullptr;
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(block) + sizeof(void*) + kAlign - 1) & ~(kAlign - 1);
  reinterpret_cast<void**>(aligned)[-1] = block;
  return reinterpret_cast<void*>(aligned);
#endif
}

void aligned_free(void* ptr) noexcept {
#if defined(__SANITIZE_ADDRESS__)
  std::free(ptr);
#else
  if (ptr) std::free(static_cast<void**>(ptr)[-1]);
#endif
}

void* cpu_allocate(int64_t nbytes) {
  cpu_malloc_reuse();  // tunes malloc once, before the first CPU block
  int64_t rounded = round_up(nbytes > 0 ? nbytes : 1, kCpuAlignment);
  void* ptr = aligned_malloc(static_cast<size_t>(rounded));
  if (!ptr) {
    // The facts only: what the program's flags can do about it is its own (runtime::main_error's hint).
    RT_THROW("CPU out of memory while allocating ", format_bytes(nbytes), " (", nbytes, " bytes); ",
             format_bytes(g_cpu_allocated.load()), " held by tensors");
  }
  int64_t now = g_cpu_allocated.fetch_add(rounded) + rounded;
  int64_t peak = g_cpu_peak.load();
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now)) {
  }
  g_cpu_allocations.fetch_add(1);
  return ptr;
}

// Shrinks a block in place (glibc's realloc splits a smaller request off the same chunk, and mremaps an
// mmapped one without moving it): the size it holds now. Kept whole under AddressSanitizer.
int64_t cpu_shrink(void* ptr, int64_t nbytes, int64_t new_nbytes) {
#if defined(__SANITIZE_ADDRESS__)
  (void)ptr;
  (void)new_nbytes;
  return nbytes;
#else
  const int64_t old_rounded = round_up(nbytes > 0 ? nbytes : 1, kCpuAlignment);
  const int64_t new_rounded = round_up(new_nbytes > 0 ? new_nbytes : 1, kCpuAlignment);
  if (new_rounded >= old_rounded) return nbytes;
  void* block = static_cast<void**>(ptr)[-1];
  const auto offset = static_cast<size_t>(static_cast<char*>(ptr) - static_cast<char*>(block));
  void* same = std::realloc(block, offset + static_cast<size_t>(new_rounded) + static_cast<size_t>(kCpuAlignment));
  if (same == nullptr) return nbytes;  // not shrunk: the block is as it was
  if (same != block) {
    // An allocator that moved it would leave the tensor's aligned pointer dangling: stop loudly.
    std::fprintf(stderr, "ringtrain: realloc moved a block it was asked to shrink\n");
    std::abort();
  }
  g_cpu_allocated.fetch_sub(old_rounded - new_rounded);
  return new_nbytes;
#endif
}

void cpu_free(void* ptr, int64_t nbytes) noexcept {
  aligned_free(ptr);
  g_cpu_allocated.fetch_sub(round_up(nbytes > 0 ? nbytes : 1, kCpuAlignment));
}
}  // namespace

AllocatorStats cpu_allocator_stats() {
  AllocatorStats s;
  s.allocated_bytes = s.reserved_bytes = g_cpu_allocated.load();
  s.peak_allocated_bytes = s.peak_reserved_bytes = g_cpu_peak.load();
  s.num_allocations = s.num_raw_allocations = g_cpu_allocations.load();
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Caching allocator

CachingAllocator::CachingAllocator(std::unique_ptr<RawBackend> backend) : backend_(std::move(backend)) {}

CachingAllocator::~CachingAllocator() {
  // Live blocks belong to tensors that may outlive us at process exit; only the cache is returned.
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

int64_t CachingAllocator::round_size(int64_t nbytes) {
  constexpr int64_t kSmall = 1 << 20;
  if (nbytes <= 0) return 512;
  if (nbytes <= kSmall) return round_up(nbytes, 512);
  return round_up(nbytes, 128 << 10);
}

void* CachingAllocator::allocate(int64_t nbytes, void* stream) {
  const int64_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.num_allocations;
  void* ptr = nullptr;
  auto lists = free_by_stream_.find(stream);
  if (lists != free_by_stream_.end()) {
    auto it = lists->second.lower_bound(size);
    if (it != lists->second.end() && it->first <= size + size / 4) {
      ptr = it->second;
      live_[ptr] = Block{it->first, stream};
      stats_.allocated_bytes += it->first;
      lists->second.erase(it);
      ++stats_.num_cache_hits;
    }
  }
  if (!ptr) {
    ptr = backend_->raw_allocate(size);
    if (!ptr) {
      // Give every cached block back and try once more before reporting.
      release_cached_locked();
      ptr = backend_->raw_allocate(size);
    }
    if (!ptr) {
      int64_t total = backend_->device_total_bytes();
      RT_THROW("out of memory on ", backend_->device_name(), " while allocating ", format_bytes(nbytes), " (", nbytes,
               " bytes requested): ", format_bytes(stats_.allocated_bytes), " allocated by tensors, ",
               format_bytes(stats_.reserved_bytes), " reserved, peak ", format_bytes(stats_.peak_allocated_bytes),
               total > 0 ? ", device total " + format_bytes(total) : std::string());
    }
    ++stats_.num_raw_allocations;
    stats_.reserved_bytes += size;
    if (stats_.reserved_bytes > stats_.peak_reserved_bytes) stats_.peak_reserved_bytes = stats_.reserved_bytes;
    live_[ptr] = Block{size, stream};
    stats_.allocated_bytes += size;
  }
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
  return ptr;
}

void CachingAllocator::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  RT_CHECK(it != live_.end(), "CachingAllocator::free: pointer ", ptr, " was not allocated by the allocator of ",
           backend_->device_name());
  stats_.allocated_bytes -= it->second.size;
  free_by_stream_[it->second.stream].emplace(it->second.size, ptr);
  live_.erase(it);
}

void CachingAllocator::release_cached_locked() {
  for (auto it = free_by_stream_.begin(); it != free_by_stream_.end();) {
    if (held_.count(it->first)) {  // a graph's: its replays write there
      ++it;
      continue;
    }
    auto& blocks = it->second;
    for (auto block = blocks.begin(); block != blocks.end();) {
      if (!backend_->raw_free(block->second)) {  // still the device's: kept, cached, counted
        ++block;
        continue;
      }
      stats_.reserved_bytes -= block->first;
      block = blocks.erase(block);
    }
    it = blocks.empty() ? free_by_stream_.erase(it) : std::next(it);
  }
}

void CachingAllocator::hold_stream(void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++held_[stream];
}

void CachingAllocator::release_stream(void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = held_.find(stream);
  RT_CHECK(it != held_.end(), "CachingAllocator::release_stream: stream ", stream, " of ", backend_->device_name(),
           " is not held");
  if (--it->second == 0) held_.erase(it);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

// ---------------------------------------------------------------------------------------------------
// Storage

Storage::Storage(void* data, int64_t nbytes, Device device, bool pinned)
    : data_(data), nbytes_(nbytes), device_(device), pinned_(pinned) {}

Storage::~Storage() {
  if (data_ == nullptr) return;  // a released tensor's (Tensor::release)
  if (pinned_)
    detail::cuda_host_free(data_);
  else if (device_.is_cpu())
    cpu_free(data_, nbytes_);
  else
    detail::cuda_free(device_.index, data_);
}

int64_t Storage::shrink(int64_t nbytes) {
  RT_CHECK(nbytes >= 0 && nbytes <= nbytes_, "Storage::shrink: ", nbytes, " bytes of a block of ", nbytes_);
  if (data_ != nullptr && device_.is_cpu() && !pinned_) nbytes_ = cpu_shrink(data_, nbytes_, nbytes);
  return nbytes_;
}

std::shared_ptr<Storage> allocate_pinned_storage(int64_t nbytes) {
  RT_CHECK(nbytes >= 0, "allocate_pinned_storage: negative size ", nbytes);
  return std::make_shared<Storage>(detail::cuda_host_allocate(nbytes), nbytes, Device::cpu(), /*pinned=*/true);
}

void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes,
                      const Stream& stream) {
  if (nbytes == 0) return;
  RT_CHECK(dst_device.is_cuda() || src_device.is_cuda(), "copy_bytes_async: neither side is a CUDA device (",
           src_device.str(), " -> ", dst_device.str(), "); use copy_bytes");
  detail::cuda_copy_bytes_async(dst, dst_device, src, src_device, nbytes, stream);
}

std::shared_ptr<Storage> allocate_storage(int64_t nbytes, Device device) {
  RT_CHECK(nbytes >= 0, "allocate_storage: negative size ", nbytes);
  void* ptr = device.is_cpu() ? cpu_allocate(nbytes) : detail::cuda_allocate(device.index, nbytes);
  return std::make_shared<Storage>(ptr, nbytes, device);
}

AllocatorStats memory_stats(Device device) {
  return device.is_cpu() ? cpu_allocator_stats() : cuda_allocator(device.index).stats();
}

void reset_peak_memory(Device device) {
  if (device.is_cuda()) {
    cuda_allocator(device.index).reset_peak();
    return;
  }
  g_cpu_peak.store(g_cpu_allocated.load());
}

void empty_cache(Device device) {
  if (device.is_cuda()) {
    cuda_allocator(device.index).empty_cache();
    return;
  }
#if !defined(__SANITIZE_ADDRESS__)
  // The heap keeps what tensors freed (tune_malloc: no trimming, so the next step reuses it); here its
  // whole free pages go back to the system, wherever they lie in the heap.
  malloc_trim(0);
#endif
}

void release_kernel_plans() {
  cpu::release_conv_plans();
  cpu::release_matmul_plans();
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, static_cast<size_t>(nbytes));
    return;
  }
  detail::cuda_copy_bytes(dst, dst_device, src, src_device, nbytes);
}

}  // namespace ringtrain
