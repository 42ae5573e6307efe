// tests/test_util.h: helpers shared by the suites: closeness checks, the finite-difference gradient
// checker, golden-file loading and a guard that skips GPU tests visibly when there is no device.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"

namespace ringtrain::testing {

// Max |a - b| / (atol + rtol |b|) <= 1 elementwise; reports the worst element.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol);
::testing::AssertionResult all_close(const std::vector<double>& actual, const std::vector<double>& expected,
                                     double rtol, double atol);

// Compares the analytic gradient of a scalar function of `inputs` (f64 CPU leaves; made to require
// grad here) with central finite differences. A non-scalar output is reduced with fixed random
// weights so every output element matters.
::testing::AssertionResult gradients_match(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                           std::vector<Tensor> inputs, double eps = 1e-6, double tol = 1e-6);

// A golden dump written by scripts/make_goldens.py: name -> tensor (f64, CPU).
struct Golden {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> meta;
  const Tensor& at(const std::string& name) const;
};
Golden load_golden(const std::string& name);

// The message of the ringtrain::Error that f throws, or "" when it throws none.
std::string error_of(const std::function<void()>& f);

// Random f64 tensor (deterministic per seed).
Tensor random_f64(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0);

// The exchange of a SyncBatchNorm that is its job's only replica: the gather is the local statistics
// themselves and the sum changes nothing (sync_batch_norm then equals batch_norm).
class SingleReplicaExchange final : public BatchNormExchange {
 public:
  Tensor all_gather(const Tensor& local) override { return local.clone(); }
  void all_reduce_sum(Tensor&) override {}
};

// GPU vs CPU agreement (relative and absolute) per dtype: a few units in the last place of the storage
// type (16-bit results may round the other way after a 1-ulp difference in f32); 0 for integers.
double cuda_vs_cpu_tolerance(DType t);

}  // namespace ringtrain::testing

// Skips (visibly, with the reason) when there is no usable CUDA device.
#define RT_REQUIRE_CUDA()                                                                                        \
  do {                                                                                                           \
    if (!::ringtrain::cuda_available()) GTEST_SKIP() << "no CUDA device: " << ::ringtrain::cuda_status().reason; \
  } while (0)
