// pack_zeros / unpack_zeros (core/pack.h): the bytes come back exactly (-0.0, NaN, denormals, any
// density, sizes that end mid-word and mid-block, 4- and 2-byte elements), on the AVX-512 and AVX2 paths
// and the plain one alike; the packing is in place (the tensor's own memory, shrunk: the allocator's count falls);
// too dense, too small, shared or unsupported tensors are refused and left as they were.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/pack.h"
#include "core/parallel.h"

namespace ringtrain {
namespace {

// A tensor of `n` elements of which about `density` are random nonzero bit patterns.
Tensor sparse(int64_t n, double density, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(Shape{n}, dtype);
  std::mt19937 gen(seed);
  std::bernoulli_distribution keep(density);
  std::uniform_int_distribution<uint32_t> bits(1, 0xFFFFFFFFU);
  if (dtype_size(dtype) == 4) {
    auto* p = t.data<uint32_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = keep(gen) ? bits(gen) : 0U;
  } else {
    auto* p = t.data<uint16_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = keep(gen) ? static_cast<uint16_t>(bits(gen) % 0xFFFFU + 1) : 0;
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<size_t>(a.nbytes())) == 0;
}

int64_t count_nonzeros(const Tensor& t) {
  int64_t k = 0;
  for (int64_t i = 0; i < t.numel(); ++i)
    k += dtype_size(t.dtype()) == 4 ? t.data<uint32_t>()[i] != 0 : t.data<uint16_t>()[i] != 0;
  return k;
}

class PackZeros : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    saved_ = detail::pack_isa();
    if (std::string(GetParam()) == "avx2" && !__builtin_cpu_supports("avx2"))
      GTEST_SKIP() << "this CPU has no AVX2: the avx2 path cannot run here";
    if (std::string(GetParam()) == "avx512" && !__builtin_cpu_supports("avx512f"))
      GTEST_SKIP() << "this CPU has no AVX-512: the avx512 path cannot run here";
    detail::set_pack_isa(GetParam());
  }
  void TearDown() override { detail::set_pack_isa(saved_.c_str()); }
  std::string saved_;
};

TEST_P(PackZeros, RoundTripsEveryByteAtEveryDensityAndSize) {
  EXPECT_STREQ(detail::pack_isa(), GetParam());
  const std::vector<int64_t> sizes{1, 7, 8, 63, 64, 65, 4095, 4096, 4097, 3 * 4096 + 129, 250001};
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t n : sizes) {
      for (double density : {0.0, 0.01, 0.5, 0.8}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " n=" << n << " density=" << density);
        const Tensor t = sparse(n, density, dtype, static_cast<uint32_t>(n * 7 + density * 100));
        const int64_t nonzeros = count_nonzeros(t), esz = dtype_size(dtype);
        // values and 16 elements of padding, 64-byte aligned, then the mask: packed only if smaller
        const int64_t packed_bytes = ((nonzeros + 16) * esz + 63) / 64 * 64 + (n + 63) / 64 * 8;
        Tensor work = t.clone();
        const std::optional<PackedZeros> p = pack_zeros(work, 1.0);
        ASSERT_EQ(p.has_value(), packed_bytes < t.nbytes());
        if (!p) {
          EXPECT_TRUE(same_bytes(work, t));  // refused: as it was
          continue;
        }
        EXPECT_FALSE(work.defined());
        EXPECT_EQ(p->nonzeros(), nonzeros);
        EXPECT_EQ(p->bytes.nbytes(), packed_bytes);
        EXPECT_TRUE(same_bytes(unpack_zeros(*p), t));
      }
    }
  }
}

TEST_P(PackZeros, KeepsNegativeZeroNanAndDenormalsAndTheShape) {
  std::vector<float> v(4000, 0.0F);
  v[3] = -0.0F;
  v[10] = std::numeric_limits<float>::quiet_NaN();
  v[11] = std::numeric_limits<float>::denorm_min();
  v[3999] = 1.5F;
  Tensor t = Tensor::empty(Shape{40, 5, 20}, DType::F32);
  std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(float));
  Tensor work = t.clone();
  const std::optional<PackedZeros> p = pack_zeros(work);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->nonzeros(), 4);  // -0.0 is a value: its sign bit is set
  const Tensor back = unpack_zeros(*p);
  EXPECT_EQ(back.shape(), (Shape{40, 5, 20}));
  EXPECT_TRUE(same_bytes(back, t));
  EXPECT_TRUE(std::signbit(back.data<float>()[3]));
}

TEST_P(PackZeros, ThreadCountDoesNotChangeTheResult) {
  const int saved = num_threads();
  const Tensor t = sparse(100003, 0.4, DType::F32, 5);
  Tensor a = t.clone(), b = t.clone();
  set_num_threads(1);
  const std::optional<PackedZeros> one = pack_zeros(a);
  set_num_threads(2);
  const std::optional<PackedZeros> two = pack_zeros(b);
  set_num_threads(saved);
  ASSERT_TRUE(one && two);
  EXPECT_EQ(one->offsets, two->offsets);
  EXPECT_TRUE(same_bytes(one->bytes, two->bytes));
  EXPECT_TRUE(same_bytes(unpack_zeros(*two), t));
}

// positive_bits and mask_by_bits (a fused ReLU's mask and its backward) agree with the plain loops: NaN,
// -0.0 and +0.0 are not positive; sizes that end mid-vector and mid-word.
TEST_P(PackZeros, ReluBitsAndTheirMaskMatchThePlainLoops) {
  for (int64_t n : {1, 15, 16, 17, 63, 64, 65, 4095, 4097, 3 * 4096 + 129}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    Tensor y = Tensor::normal(Shape{n}, 0, 1, static_cast<uint64_t>(n));
    float* py = y.data<float>();
    py[0] = -0.0F;
    if (n > 3) py[3] = std::numeric_limits<float>::quiet_NaN();
    if (n > 5) py[5] = 0.0F;
    const Tensor dy = Tensor::normal(Shape{n}, 0, 1, static_cast<uint64_t>(n) + 1);
    const Tensor bits = positive_bits(y);
    Tensor out = Tensor::empty(Shape{n});
    mask_by_bits(dy, bits, out);
    for (int64_t i = 0; i < n; ++i) {
      const bool positive = py[i] > 0.0F;
      ASSERT_EQ(((bits.data<uint64_t>()[i / 64] >> (i % 64)) & 1U) != 0, positive) << i;
      const float want = positive ? dy.data<float>()[i] : 0.0F;
      ASSERT_EQ(std::memcmp(&out.data<float>()[i], &want, sizeof(float)), 0) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, PackZeros, ::testing::Values("avx512", "avx2", "generic"));

TEST(PackZerosInPlace, AHalfZeroTensorGivesAboutHalfItsBytesBack) {
  Tensor t = sparse(1 << 20, 0.5, DType::F32, 9);
  const int64_t dense = t.nbytes();
  const int64_t before = cpu_allocator_stats().allocated_bytes;
  std::optional<PackedZeros> p = pack_zeros(t);
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(t.defined());
  const double ratio = static_cast<double>(p->nbytes()) / static_cast<double>(dense);
  EXPECT_NEAR(ratio, 0.5 + 1.0 / 32, 0.01);
#if !defined(__SANITIZE_ADDRESS__)
  // The same memory, shrunk: the allocator holds the packed size, no second copy.
  const int64_t freed = before - cpu_allocator_stats().allocated_bytes;
  EXPECT_NEAR(static_cast<double>(freed), static_cast<double>(dense - p->bytes.nbytes()), 64.0);
#else
  (void)before;
#endif
}

TEST(PackZerosRefuses, DenseSharedSmallUnsupportedAndEmptyTensors) {
  const Tensor dense = sparse(100000, 0.95, DType::F32, 1);
  Tensor work = dense.clone();
  EXPECT_FALSE(pack_zeros(work, 0.8).has_value());
  EXPECT_TRUE(same_bytes(work, dense));
  EXPECT_TRUE(pack_zeros(work, 1.0).has_value());
  Tensor tiny = Tensor::zeros(Shape{4}, DType::F32);  // the padding and mask would not fit in 16 bytes
  Tensor f64 = Tensor::zeros(Shape{1000}, DType::F64), u8 = Tensor::zeros(Shape{1000}, DType::U8);
  Tensor empty = Tensor::zeros(Shape{0}, DType::F32), undefined;
  EXPECT_FALSE(pack_zeros(tiny).has_value());
  EXPECT_TRUE(tiny.defined());
  EXPECT_FALSE(pack_zeros(f64).has_value());
  EXPECT_FALSE(pack_zeros(u8).has_value());
  EXPECT_FALSE(pack_zeros(empty).has_value());
  EXPECT_FALSE(pack_zeros(undefined).has_value());
  // Another handle on the memory would see it change: refused with an error naming the tensor.
  Tensor shared = Tensor::zeros(Shape{5000}, DType::F32);
  const Tensor view = shared.reshape(Shape{50, 100});
  try {
    pack_zeros(shared);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("f32[5000]"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(shared.defined());
}

TEST(PackZerosRefuses, UnknownPathIsAnErrorNamingIt) {
  try {
    detail::set_pack_isa("avx9");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("avx9"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ringtrain
