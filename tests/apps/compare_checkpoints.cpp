// compare_checkpoints A.h5 B.h5: exits 0 and prints "identical: N tensors" when both checkpoints hold
// the same /model and /optimizer entries with bitwise equal values; otherwise names the first
// difference and exits 1. Used by the exact-resume test.
#include <cstdio>
#include <cstring>

#include "core/checkpoint.h"

using namespace ringtrain;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: compare_checkpoints A.h5 B.h5\n");
    return 2;
  }
  try {
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
        if (x[i].first != y[i].first || s.shape() != t.shape() || s.dtype() != t.dtype() ||
            std::memcmp(s.data_ptr(), t.data_ptr(), static_cast<size_t>(s.nbytes())) != 0) {
          std::printf("different: /%s/%s\n", part, x[i].first.c_str());
          return 1;
        }
      }
    }
    std::printf("identical: %zu tensors\n", count);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_checkpoints: %s\n", e.what());
    return 2;
  }
}
