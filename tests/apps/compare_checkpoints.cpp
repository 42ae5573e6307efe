// compare_checkpoints A.h5 B.h5 [--rtol X] [--without-bn-statistics]: exits 0 and prints "identical: N tensors" when
// both checkpoints hold the same /model and /optimizer entries with bitwise equal values; otherwise names the first
// difference and exits 1. Used by the exact-resume test. With --rtol, values may differ by X of the tensor's scale
// (max |a - b| <= X * max |a|, for sums taken in another order): prints "close: N tensors, worst R at NAME". With
// --without-bn-statistics the batch norms' running statistics and counts are left out: a data-parallel rank moves
// them with its own micro-batches only, one process with all of them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "core/parse.h"
#include "io/checkpoint.h"

using namespace ringtrain;

bool is_bn_statistic(const std::string& name) {
  for (const char* tail : {"running_mean", "running_var", "num_batches_tracked"})
    if (name.size() >= std::strlen(tail) && name.compare(name.size() - std::strlen(tail), std::string::npos, tail) == 0)
      return true;
  return false;
}

int main(int argc, char** argv) {
  double rtol = -1;
  bool without_bn = false, bad = argc < 3;
  for (int i = 3; i < argc && !bad; ++i) {
    if (std::strcmp(argv[i], "--without-bn-statistics") == 0) {
      without_bn = true;
    } else if (std::strcmp(argv[i], "--rtol") == 0 && i + 1 < argc) {
      const std::optional<double> v = ringtrain::to_number<double>(argv[++i]);
      rtol = v.value_or(-1);
      bad = !(rtol >= 0);
    } else {
      bad = true;
    }
  }
  if (bad) {
    std::fprintf(stderr, "usage: compare_checkpoints A.h5 B.h5 [--rtol X] [--without-bn-statistics]\n");
    return 2;
  }
  try {
    double worst = 0;
    std::string worst_name;
    const Checkpoint a = load_checkpoint(argv[1]), b = load_checkpoint(argv[2]);
    size_t count = 0;
    for (const auto* part : {"model", "optimizer"}) {
      const NamedTensors& x = std::strcmp(part, "model") == 0 ? a.model : a.optimizer;
      const NamedTensors& y = std::strcmp(part, "model") == 0 ? b.model : b.optimizer;
      if (x.size() != y.size()) {
        std::printf("different: /%s has %zu entries in A and %zu in B\n", part, x.size(), y.size());
        return 1;
      }
      for (size_t i = 0; i < x.size(); ++i, ++count) {
        const Tensor& s = x[i].second;
        const Tensor& t = y[i].second;
        const std::string name = std::string("/") + part + "/" + x[i].first;
        if (x[i].first != y[i].first || s.shape() != t.shape() || s.dtype() != t.dtype()) {
          std::printf("different: %s (name, shape or dtype)\n", name.c_str());
          return 1;
        }
        if (without_bn && is_bn_statistic(x[i].first)) continue;
        if (rtol < 0) {
          if (std::memcmp(s.data_ptr(), t.data_ptr(), static_cast<size_t>(s.nbytes())) != 0) {
            std::printf("different: %s\n", name.c_str());
            return 1;
          }
          continue;
        }
        const auto u = s.to_vector(), v = t.to_vector();
        double scale = 0, diff = 0;
        for (size_t k = 0; k < u.size(); ++k) {
          scale = std::max(scale, std::fabs(u[k]));
          diff = std::max(diff, std::fabs(u[k] - v[k]));
        }
        const double rel = diff / std::max(scale, 1e-30);
        if (!(rel <= rtol)) {
          std::printf("different: %s differs by %.3g of its scale (--rtol %g)\n", name.c_str(), rel, rtol);
          return 1;
        }
        if (rel > worst) {
          worst = rel;
          worst_name = name;
        }
      }
    }
    if (rtol >= 0) {
      std::printf("close: %zu tensors, worst %.3g at %s\n", count, worst,
                  worst_name.empty() ? "-" : worst_name.c_str());
      return 0;
    }
    std::printf("identical: %zu tensors\n", count);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_checkpoints: %s\n", e.what());
    return 2;
  }
}
