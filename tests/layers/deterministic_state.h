// tests/layers/deterministic_state.h: fills every parameter and buffer of a model from the formula of
// deterministic_state() in scripts/make_goldens.py ((state dict entry index, flat index in ringtrain's layout)), so
// the whole-model goldens need no stored weights. The entry index counts num_batches_tracked too, which stays.
#pragma once

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "layers/module.h"

namespace ringtrain::testing {

inline void deterministic_state(Module& model) {
  NoGradGuard no_grad;
  int64_t e = 0;
  for (auto& [name, t] : model.state_dict()) {
    const int64_t index = e++;
    if (name.ends_with("num_batches_tracked")) continue;
    const int64_t n = t.numel();
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double wave = std::sin(0.1 * static_cast<double>(i) + 0.7 * static_cast<double>(index));
      double value;
      if (name.ends_with("running_var"))
        value = 1.0 + 0.5 * std::abs(wave);
      else if (name.ends_with("running_mean") || name.ends_with("bias"))
        value = 0.1 * wave;
      else if (t.ndim() == 1)
        value = 1.0 + 0.2 * wave;
      else
        value = wave * std::sqrt(2.0 / static_cast<double>(n / t.size(0)));
      v[static_cast<size_t>(i)] = value;
    }
    Tensor(t).copy_(Tensor::from_vector(v, t.shape(), t.dtype()));
  }
}

}  // namespace ringtrain::testing
