// Tests for core/allocator.h: the caching allocator's size classes, per-stream reuse, statistics,
// empty_cache and its out-of-memory message, driven through a fake device backend on the CPU.
#include <sys/resource.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "core/allocator.h"
#include "core/check.h"
#include "core/tensor.h"

namespace ringtrain {
namespace {

class FakeBackend : public RawBackend {
 public:
  FakeBackend(int64_t capacity, int* raw_frees) : capacity_(capacity), raw_frees_(raw_frees) {}
  void* raw_allocate(int64_t nbytes) override {
    if (used_ + nbytes > capacity_) return nullptr;
    used_ += nbytes;
    void* p = std::malloc(static_cast<size_t>(nbytes));
    sizes_[p] = nbytes;
    return p;
  }
  bool raw_free(void* ptr) noexcept override {
    if (refuse_frees) return false;  // as cudaFree failing (e.g. called where a capture forbids it)
    used_ -= sizes_[ptr];
    sizes_.erase(ptr);
    std::free(ptr);
    ++*raw_frees_;
    return true;
  }
  bool refuse_frees = false;
  int64_t device_total_bytes() const override { return capacity_; }
  std::string device_name() const override { return "cuda:7"; }

 private:
  int64_t capacity_, used_ = 0;
  int* raw_frees_;
  std::map<void*, int64_t> sizes_;
};

TEST(CachingAllocator, SizeClasses) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512);
  EXPECT_EQ(CachingAllocator::round_size(512), 512);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024);
  EXPECT_EQ(CachingAllocator::round_size(1 << 20), 1 << 20);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), (1 << 20) + (128 << 10));
}

TEST(CachingAllocator, ReusesFreedBlocksOfTheSameStreamOnly) {
  int raw_frees = 0;
  CachingAllocator alloc(std::make_unique<FakeBackend>(1 << 24, &raw_frees));
  void* stream_a = reinterpret_cast<void*>(0x1);
  void* stream_b = reinterpret_cast<void*>(0x2);
  void* p = alloc.allocate(1000, stream_a);
  alloc.free(p);
  void* q = alloc.allocate(900, stream_a);  // same size class (1024): served from cache
  EXPECT_EQ(q, p);
  void* r = alloc.allocate(1000, stream_b);  // another stream never gets stream_a's blocks
  EXPECT_NE(r, p);
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.num_allocations, 3);
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(s.num_raw_allocations, 2);
  EXPECT_EQ(s.allocated_bytes, 2048);
  EXPECT_EQ(s.reserved_bytes, 2048);
  alloc.free(q);
  alloc.free(r);
  // A much larger block is not used for a small request (bounded waste).
  void* big = alloc.allocate(1 << 20, stream_a);
  alloc.free(big);
  void* small = alloc.allocate(4096, stream_a);
  EXPECT_NE(small, big);
  alloc.free(small);
}

TEST(CachingAllocator, StatisticsPeakAndEmptyCache) {
  int raw_frees = 0;
  CachingAllocator alloc(std::make_unique<FakeBackend>(1 << 24, &raw_frees));
  void* a = alloc.allocate(4096, nullptr);
  void* b = alloc.allocate(8192, nullptr);
  alloc.free(a);
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.allocated_bytes, 8192);
  EXPECT_EQ(s.reserved_bytes, 4096 + 8192);
  EXPECT_EQ(s.peak_allocated_bytes, 4096 + 8192);
  alloc.empty_cache();
  EXPECT_EQ(raw_frees, 1);  // only the cached block goes back; b is live
  EXPECT_EQ(alloc.stats().reserved_bytes, 8192);
  alloc.reset_peak();
  EXPECT_EQ(alloc.stats().peak_allocated_bytes, 8192);
  alloc.free(b);
  EXPECT_THROW(alloc.free(reinterpret_cast<void*>(0x1234)), Error);
}

TEST(CachingAllocator, OutOfMemoryReleasesCacheThenExplains) {
  int raw_frees = 0;
  CachingAllocator alloc(std::make_unique<FakeBackend>(3 << 20, &raw_frees));
  void* a = alloc.allocate(2 << 20, nullptr);
  alloc.free(a);  // cached, 2 MiB reserved
  // 2 MiB more does not fit next to the cached block: the cache is released and the retry succeeds.
  void* b = alloc.allocate((2 << 20) + 1, nullptr);
  EXPECT_EQ(raw_frees, 1);
  try {
    alloc.allocate(1536 << 20, nullptr);
    FAIL() << "allocated beyond capacity";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("out of memory on cuda:7"), std::string::npos) << w;
    EXPECT_NE(w.find("1.50 GiB"), std::string::npos) << w;
    EXPECT_NE(w.find("allocated by tensors"), std::string::npos) << w;
    EXPECT_NE(w.find("peak"), std::string::npos) << w;
    // The facts only: which flags help is the program's to say (runtime::main_error's hint), not the core's
    // (an all-reduce benchmark has no batch size).
    EXPECT_EQ(w.find("batch"), std::string::npos) << w;
  }
  alloc.free(b);
}

// A block the device does not take back stays the allocator's: cached (and reused), counted as reserved, and
// given back by a later empty_cache. It never leaves the books while its memory is still allocated.
TEST(CachingAllocator, ABlockTheDeviceDidNotTakeBackStaysCachedAndCounted) {
  int raw_frees = 0;
  auto backend = std::make_unique<FakeBackend>(3 << 20, &raw_frees);
  FakeBackend* device = backend.get();
  CachingAllocator alloc(std::move(backend));
  void* a = alloc.allocate(1 << 20, nullptr);
  void* b = alloc.allocate(1 << 20, nullptr);
  alloc.free(a);
  alloc.free(b);
  device->refuse_frees = true;
  alloc.empty_cache();
  EXPECT_EQ(raw_frees, 0);
  EXPECT_EQ(alloc.stats().reserved_bytes, 2 << 20) << "the memory is still the device's";
  // An out-of-memory retry that cannot free either: out of memory, naming what is reserved.
  try {
    alloc.allocate(2 << 20, nullptr);
    ADD_FAILURE() << "3 MiB of device for 2 MiB reserved and 2 MiB more";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2.00 MiB reserved"), std::string::npos) << e.what();
  }
  // Still cached: served again without a new device allocation.
  void* again = alloc.allocate(1 << 20, nullptr);
  EXPECT_TRUE(again == a || again == b);
  EXPECT_EQ(alloc.stats().num_raw_allocations, 2);
  alloc.free(again);
  device->refuse_frees = false;
  alloc.empty_cache();
  EXPECT_EQ(raw_frees, 2);
  EXPECT_EQ(alloc.stats().reserved_bytes, 0);
}

// A CUDA graph's stream is held while the graph lives: its replays write into the blocks its capture freed
// back under that stream, so neither empty_cache nor an out-of-memory retry may give them to the device.
TEST(CachingAllocator, AHeldStreamsCacheSurvivesEmptyCacheAndTheOutOfMemoryRetry) {
  int raw_frees = 0;
  CachingAllocator alloc(std::make_unique<FakeBackend>(3 << 20, &raw_frees));
  void* graph = reinterpret_cast<void*>(0x9);
  alloc.hold_stream(graph);
  alloc.hold_stream(graph);  // counted
  void* g = alloc.allocate(1 << 20, graph);
  alloc.free(g);  // the capture's block, cached under the graph's stream
  void* other = alloc.allocate(4096, nullptr);
  alloc.free(other);
  alloc.empty_cache();
  EXPECT_EQ(raw_frees, 1) << "only the other stream's block goes back";
  EXPECT_EQ(alloc.stats().reserved_bytes, 1 << 20);
  // 2.5 MiB does not fit beside the held 1 MiB: the retry may not take it, so this is out of memory.
  EXPECT_THROW(alloc.allocate((5 << 20) / 2, nullptr), Error);
  EXPECT_EQ(alloc.allocate(1 << 20, graph), g) << "the replay's block is still the graph's";
  alloc.free(g);
  alloc.release_stream(graph);
  alloc.empty_cache();
  EXPECT_EQ(raw_frees, 1) << "still held once";
  alloc.release_stream(graph);
  alloc.empty_cache();
  EXPECT_EQ(raw_frees, 2);
  EXPECT_EQ(alloc.stats().reserved_bytes, 0);
  EXPECT_THROW(alloc.release_stream(graph), Error) << "released more often than held";
}

TEST(CpuAllocator, TracksLiveBytes) {
  const int64_t before = cpu_allocator_stats().allocated_bytes;
  {
    Tensor t = Tensor::empty(Shape{1000}, DType::F64);
    EXPECT_GE(cpu_allocator_stats().allocated_bytes, before + 8000);
    Tensor view = t.slice(0, 10);
    t = Tensor();
    EXPECT_GE(cpu_allocator_stats().allocated_bytes, before + 8000) << "a view keeps its storage alive";
  }
  EXPECT_EQ(cpu_allocator_stats().allocated_bytes, before);
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 << 20), "3.00 MiB");
}

// A freed large tensor's pages are reused by the next one of its size instead of being given back to
// the system and faulted in (and zeroed) again: what every training step does with its activations.
long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

TEST(CpuAllocator, ReusesFreedLargeBlocksWithoutPageFaults) {
  if (!cpu_malloc_reuse())
    GTEST_SKIP() << "malloc reuse is off (RINGTRAIN_MALLOC_DEFAULTS=1, AddressSanitizer or old glibc)";
  const Shape shape{4 << 20};  // 16 MiB of f32: above glibc's default mmap threshold
  { Tensor warm = Tensor::zeros(shape); }
  const long before = minor_faults();
  for (int step = 0; step < 3; ++step) {
    Tensor a = Tensor::zeros(shape), b = Tensor::zeros(shape);  // two live at once, as in a step
  }
  const long faults = minor_faults() - before;
  // Untuned, each 16 MiB tensor faults in about 4096 pages (24,576 over the loop).
  EXPECT_LT(faults, 6000) << faults << " minor page faults for 6 allocations of 16 MiB that reuse freed memory";
}

}  // namespace
}  // namespace ringtrain
