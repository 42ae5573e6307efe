// tests/test_util.cpp: implementations of the shared test helpers.
#include "test_util.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/autograd.h"
#include "core/check.h"

namespace ringtrain::testing {

::testing::AssertionResult all_close(const std::vector<double>& actual, const std::vector<double>& expected,
                                     double rtol, double atol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << " vs " << expected.size();
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (std::isnan(a) != std::isnan(e))
      return ::testing::AssertionFailure() << "NaN mismatch at " << i << ": " << a << " vs " << e;
    if (std::isnan(a)) continue;
    if (std::isinf(a) || std::isinf(e)) {
      if (a != e) return ::testing::AssertionFailure() << "inf mismatch at " << i << ": " << a << " vs " << e;
      continue;
    }
    const double ratio = std::abs(a - e) / (atol + rtol * std::abs(e));
    if (ratio > worst) {
      worst = ratio;
      worst_i = i;
    }
  }
  if (worst > 1.0) {
    return ::testing::AssertionFailure() << "element " << worst_i << ": " << actual[worst_i] << " vs expected "
                                         << expected[worst_i] << " (error " << worst << "x the tolerance rtol=" << rtol
                                         << " atol=" << atol << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (!(actual.shape() == expected.shape()))
    return ::testing::AssertionFailure() << "shapes differ: " << actual.describe() << " vs " << expected.describe();
  return all_close(actual.to_vector(), expected.to_vector(), rtol, atol);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Tensor random_f64(const Shape& shape, uint64_t seed, double low, double high) {
  return Tensor::uniform(shape, low, high, seed, DType::F64);
}

::testing::AssertionResult gradients_match(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                           std::vector<Tensor> inputs, double eps, double tol) {
  for (auto& t : inputs) {
    if (t.dtype() != DType::F64 || !t.device().is_cpu())
      return ::testing::AssertionFailure() << "gradcheck needs f64 CPU inputs, got " << t.describe();
    t.set_requires_grad(true);
    t.zero_grad();
  }
  Tensor weights;
  auto scalar_loss = [&](const std::vector<Tensor>& in) {
    Tensor out = f(in);
    if (out.numel() == 1) return out.reshape(Shape{});
    if (!weights.defined()) weights = Tensor::uniform(out.shape(), 0.5, 1.5, 12345, DType::F64);
    return sum(mul(out, weights));
  };
  Tensor loss = scalar_loss(inputs);
  loss.backward();
  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    Tensor analytic = x.grad();
    if (!analytic.defined()) return ::testing::AssertionFailure() << "input " << k << " received no gradient";
    std::vector<double> ana = analytic.to_vector();
    double* p = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double saved = p[i];
      p[i] = saved + eps;
      const double up = scalar_loss(inputs).item();
      p[i] = saved - eps;
      const double down = scalar_loss(inputs).item();
      p[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      const double a = ana[static_cast<size_t>(i)];
      if (std::abs(numeric - a) > tol * std::max(1.0, std::abs(numeric))) {
        return ::testing::AssertionFailure() << "input " << k << " " << x.shape() << " element " << i << ": analytic "
                                             << a << " vs numeric " << numeric;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

const Tensor& Golden::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw std::runtime_error("golden has no tensor '" + name + "'");
  return it->second;
}

Golden load_golden(const std::string& name) {
  const std::string path = std::string(RINGTRAIN_GOLDEN_DIR) + "/" + name + ".json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open golden file " + path + " (run scripts/make_goldens.py)");
  nlohmann::json j = nlohmann::json::parse(in);
  Golden g;
  for (auto& [key, value] : j.items()) {
    if (key == "meta") {
      for (auto& [mk, mv] : value.items())
        if (mv.is_number()) g.meta[mk] = mv.get<double>();
      continue;
    }
    std::vector<int64_t> dims = value.at("shape").get<std::vector<int64_t>>();
    std::vector<double> data = value.at("data").get<std::vector<double>>();
    g.tensors[key] = Tensor::from_vector(data, Shape(std::span<const int64_t>(dims)), DType::F64);
  }
  return g;
}

double cuda_vs_cpu_tolerance(DType t) {
  switch (t) {
    case DType::F64:
      return 1e-12;
    case DType::F32:
      return 1e-5;
    case DType::F16:
      return 2e-3;
    case DType::BF16:
      return 1.6e-2;
    default:
      return 0;
  }
}

}  // namespace ringtrain::testing
