// parallel_for (core/parallel.h): every index exactly once for any size, grain and thread count; the
// first exception reaches the caller and the pool stays usable; nested calls run inline; several
// threads take part; two host threads may call it at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/parallel.h"

namespace ringtrain {
namespace {

class ParallelFor : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = num_threads(); }
  void TearDown() override { set_num_threads(saved_); }
  int saved_ = 1;
};

std::vector<int> counts_after(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    ASSERT_LE(0, begin);
    ASSERT_LE(begin, end);
    ASSERT_LE(end, n);
    for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
  });
  std::vector<int> out;
  for (auto& h : hits) out.push_back(h.load());
  return out;
}

TEST_F(ParallelFor, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 100003}) {
      for (int64_t grain : {1, 3, 64, 1 << 20}) {
        const std::vector<int> hits = counts_after(n, grain);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<size_t>(i)], 1)
              << "threads " << threads << " n " << n << " grain " << grain << " index " << i;
      }
    }
  }
}

TEST_F(ParallelFor, FirstExceptionReachesTheCallerAndThePoolStaysUsable) {
  set_num_threads(2);
  EXPECT_THROW(parallel_for(1000, 1,
                            [](int64_t begin, int64_t) {
                              if (begin >= 0) throw std::runtime_error("chunk failed");
                            }),
               std::runtime_error);
  const std::vector<int> hits = counts_after(1000, 1);
  for (int h : hits) ASSERT_EQ(h, 1);
}

TEST_F(ParallelFor, NestedCallsRunInline) {
  set_num_threads(2);
  std::atomic<int64_t> total{0};
  parallel_for(8, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto outer = std::this_thread::get_id();
      parallel_for(100, 1, [&](int64_t b, int64_t e) {
        EXPECT_EQ(std::this_thread::get_id(), outer) << "a nested call must run on the calling thread";
        total += e - b;
      });
    }
  });
  EXPECT_EQ(total.load(), 800);
}

TEST_F(ParallelFor, SeveralThreadsTakePart) {
  set_num_threads(2);
  std::mutex m;
  std::set<std::thread::id> ids;
  std::atomic<int> inside{0};
  parallel_for(2, 1, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    }
    // Hold this chunk until the other has started, so one thread cannot run both.
    inside++;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (inside.load() < 2 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  });
  EXPECT_EQ(ids.size(), 2u);
}

TEST_F(ParallelFor, TwoHostThreadsAtOnce) {
  set_num_threads(2);
  std::vector<int> a, b;
  std::thread other([&] { a = counts_after(50000, 16); });
  b = counts_after(50000, 16);
  other.join();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], 1) << i;
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], 1) << i;
}

}  // namespace
}  // namespace ringtrain
