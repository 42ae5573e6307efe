// Tests for core/tensor.h: creation, views sharing storage, conversion, RNG determinism, printing.
#include <gtest/gtest.h>

#include <cmath>

#include "core/allocator.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "core/tensor.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;

TEST(Shape, BasicsAndLimits) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.ndim(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(s.wrap_dim(-1, "test"), 2);
  EXPECT_THROW(s.wrap_dim(3, "test"), Error);
  EXPECT_NO_THROW(Shape({1, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_THROW(Shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);
}

TEST(Tensor, CreationFillAndValues) {
  Tensor t = Tensor::full(Shape{2, 3}, 2.5);
  EXPECT_EQ(t.dtype(), DType::F32);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.nbytes(), 24);
  EXPECT_EQ(t.to_vector(), std::vector<double>(6, 2.5));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u) << "CPU storage must be 64-byte aligned";
  Tensor v = Tensor::from_vector({1, 2, 3, 4}, Shape{2, 2}, DType::I32);
  EXPECT_EQ(v.to_vector(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_THROW(Tensor::from_vector({1, 2, 3}, Shape{2, 2}), Error);
  EXPECT_DOUBLE_EQ(Tensor::scalar(7.0, DType::F64).item(), 7.0);
  EXPECT_THROW(t.item(), Error);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, Shape{3, 2});
  Tensor r = t.reshape(Shape{2, -1});
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_TRUE(r.shares_storage_with(t));
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.to_vector(), (std::vector<double>{2, 3, 4, 5}));
  s.fill_(9);  // writes through to the base
  EXPECT_EQ(t.to_vector(), (std::vector<double>{0, 1, 9, 9, 9, 9}));
  EXPECT_EQ(t.flatten().shape(), (Shape{6}));
  Tensor d = t.detach();
  EXPECT_TRUE(d.shares_storage_with(t));
  EXPECT_EQ(t.slice(3, 3).numel(), 0);
}

TEST(Tensor, ViewErrorsNameShapes) {
  Tensor t = Tensor::zeros(Shape{3, 2});
  try {
    t.reshape(Shape{4, 2});
    FAIL();
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("[3, 2]"), std::string::npos) << w;
    EXPECT_NE(w.find("[4, 2]"), std::string::npos) << w;
  }
  EXPECT_THROW(t.reshape(Shape{-1, -1}), Error);
  EXPECT_THROW(t.reshape(Shape{-1, 4}), Error);
  EXPECT_THROW(t.slice(2, 4), Error);
  EXPECT_THROW(t.slice(2, 1), Error);
}

TEST(Tensor, DtypeConversionRoundTrips) {
  Tensor x = Tensor::from_vector({-2.75, -1, 0, 0.5, 1.5, 100}, Shape{6}, DType::F64);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    EXPECT_EQ(x.to(t).to(DType::F64).to_vector(), x.to_vector()) << dtype_name(t);
  }
  EXPECT_EQ(x.to(DType::I32).to_vector(), (std::vector<double>{-2, -1, 0, 0, 1, 100}));
  EXPECT_EQ(x.to(DType::I64).to(DType::U8).to_vector(), (std::vector<double>{254, 255, 0, 0, 1, 100}));
  EXPECT_EQ(Tensor::from_vector({200}, Shape{1}, DType::U8).to(DType::F16).item(), 200.0);
  Tensor same = x.to(DType::F64);
  EXPECT_TRUE(same.shares_storage_with(x)) << "a no-op conversion returns the same tensor";
}

TEST(Tensor, CopyAndInPlace) {
  Tensor a = Tensor::zeros(Shape{4});
  Tensor b = Tensor::from_vector({1, 2, 3, 4}, Shape{4}, DType::F64);
  a.copy_(b);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  a.add_(Tensor::ones(Shape{4}), 2.0);
  EXPECT_EQ(a.to_vector(), (std::vector<double>{3, 4, 5, 6}));
  a.mul_(0.5);
  EXPECT_EQ(a.to_vector(), (std::vector<double>{1.5, 2, 2.5, 3}));
  EXPECT_THROW(a.copy_(Tensor::zeros(Shape{5})), Error);
  EXPECT_THROW(a.add_(Tensor::zeros(Shape{4}, DType::F64)), Error);
  Tensor c = a.clone();
  EXPECT_FALSE(c.shares_storage_with(a));
  EXPECT_EQ(c.to_vector(), a.to_vector());
}

TEST(Tensor, RandomDependsOnlyOnSeedAndIndex) {
  Tensor big = Tensor::normal(Shape{1000}, 0.0, 1.0, 42);
  Tensor again = Tensor::normal(Shape{1000}, 0.0, 1.0, 42);
  EXPECT_EQ(big.to_vector(), again.to_vector());
  // A prefix of a larger draw equals a smaller draw: values are a function of the element index.
  Tensor small = Tensor::normal(Shape{10}, 0.0, 1.0, 42);
  EXPECT_EQ(big.slice(0, 10).to_vector(), small.to_vector());
  EXPECT_NE(Tensor::normal(Shape{10}, 0.0, 1.0, 43).to_vector(), small.to_vector());
  EXPECT_NE(Tensor::normal(Shape{10}, 0.0, 1.0, 42, DType::F32, Device::cpu(), 1).to_vector(), small.to_vector());
  // Independent of the thread count.
  const int threads = num_threads();
  Tensor huge = Tensor::uniform(Shape{1 << 17}, -1, 1, 7);
  set_num_threads(1);
  Tensor huge_single = Tensor::uniform(Shape{1 << 17}, -1, 1, 7);
  set_num_threads(threads);
  EXPECT_EQ(huge.to_vector(), huge_single.to_vector());
}

TEST(Tensor, RandomHasTheRightMoments) {
  const int64_t n = 200000;
  std::vector<double> u = Tensor::uniform(Shape{n}, 2.0, 4.0, 3, DType::F64).to_vector();
  double mean = 0, var = 0, lo = 1e9, hi = -1e9;
  for (double v : u) {
    mean += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  mean /= n;
  for (double v : u) var += (v - mean) * (v - mean);
  var /= n;
  EXPECT_NEAR(mean, 3.0, 0.01);
  EXPECT_NEAR(var, 4.0 / 12.0, 0.005);
  EXPECT_GE(lo, 2.0);
  EXPECT_LT(hi, 4.0);
  std::vector<double> z = Tensor::normal(Shape{n}, 1.0, 2.0, 5).to_vector();
  mean = var = 0;
  for (double v : z) mean += v;
  mean /= n;
  for (double v : z) var += (v - mean) * (v - mean);
  var /= n;
  EXPECT_NEAR(mean, 1.0, 0.02);
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.02);
}

TEST(Tensor, PrintsSmallTensorsReadably) {
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  std::string s = to_string(t);
  EXPECT_NE(s.find("Tensor(f32[2, 3], cpu)"), std::string::npos) << s;
  EXPECT_NE(s.find("[[1, 2, 3],\n [4, 5, 6]]"), std::string::npos) << s;
  Tensor big = Tensor::zeros(Shape{100, 100});
  EXPECT_NE(to_string(big).find("10000 elements not shown"), std::string::npos);
  Tensor named = Tensor::zeros(Shape{1}, DType::I64);
  named.set_name("layer1.0.conv1.weight");
  EXPECT_NE(to_string(named).find("'layer1.0.conv1.weight'"), std::string::npos);
}

// A pipeline stage drops the other stages' weights: the memory goes, the description stays, and a read is
// an error naming the tensor instead of a crash.
TEST(Tensor, ReleaseDropsTheMemoryButKeepsTheDescription) {
  const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
  Tensor w = Tensor::ones(Shape{256, 256});
  w.set_name("fc.weight");
  Tensor same = w;  // another handle of the same tensor (as a module and a list of parameters hold it)
  EXPECT_GE(memory_stats(Device::cpu()).allocated_bytes - before, 256 * 256 * 4);
  EXPECT_FALSE(w.released());
  w.release();
  EXPECT_TRUE(same.released());
  EXPECT_EQ(memory_stats(Device::cpu()).allocated_bytes, before);
  EXPECT_EQ(same.shape(), (Shape{256, 256}));
  EXPECT_EQ(same.dtype(), DType::F32);
  EXPECT_EQ(same.name(), "fc.weight");
  const std::string e = testing::error_of([&] { (void)same.data_ptr(); });
  EXPECT_NE(e.find("tensor 'fc.weight' f32[256, 256] on cpu was released"), std::string::npos) << e;
  EXPECT_FALSE(Tensor::zeros(Shape{0}).released());  // empty is not released
}

// sole_owner: true only for a handle no other handle, view or detached handle shares memory with.
TEST(Tensor, SoleOwnerOnlyWhenNothingElseSharesTheMemory) {
  Tensor t = Tensor::zeros(Shape{4, 4});
  EXPECT_TRUE(t.sole_owner());
  {
    const Tensor copy = t;  // the same handle twice
    EXPECT_FALSE(t.sole_owner());
  }
  EXPECT_TRUE(t.sole_owner());
  {
    const Tensor view = t.reshape(Shape{16});
    EXPECT_FALSE(t.sole_owner());
    EXPECT_FALSE(view.sole_owner());
  }
  {
    const Tensor detached = t.detach();
    EXPECT_FALSE(t.sole_owner());
  }
  EXPECT_TRUE(t.sole_owner());
  EXPECT_FALSE(Tensor().sole_owner());
}

}  // namespace
}  // namespace ringtrain
