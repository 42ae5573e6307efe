// core/cpu/optim.cpp: the CPU fused multi-tensor SGD and AdamW steps, loss-scale unscaling and the exact
// gradient norm's passes, one pass over each tensor. The per-element updates are core/kernels.h's, shared
// with the CUDA kernels (core/cuda/optim.cu). Built with -fno-math-errno (core/CMakeLists.txt) so that the AdamW sqrt
// loop vectorizes.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"
#include "core/parallel.h"

namespace ringtrain::cpu {
namespace {

// ---------------------------------------------------------------------------------------------------
// fused SGD: one pass over each parameter (reads p, g, buf once; writes p, buf once)

void sgd_multi_tensor(const std::vector<SgdTensor>& tensors, const SgdArgs& a) {
  for (const SgdTensor& t : tensors) {
    visit_floating(t.param->dtype(), "sgd", [&](auto tag) {
      using S = typename decltype(tag)::type;
      using C = compute_t<S>;
      S* p = t.param->data<S>();
      const S* g = t.grad->data<S>();
      S* m = t.momentum ? t.momentum->data<S>() : nullptr;
      const C wd = static_cast<C>(t.weight_decay), mom = static_cast<C>(a.momentum),
              keep = static_cast<C>(1.0 - a.dampening),
              lr = static_cast<C>(a.values ? a.values->data<double>()[0] : a.lr);
      const bool init = t.init_momentum, nesterov = a.nesterov;
      parallel_for(t.param->numel(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          sgd_element<S, C>(p[i], g[i], m ? m + i : nullptr, wd, mom, keep, lr, init, nesterov);
      });
    });
  }
}

// fused AdamW: one pass over each parameter (reads p, g, m, v once; writes p, m, v once)

void adamw_multi_tensor(const std::vector<AdamWTensor>& tensors, const AdamWArgs& a) {
  for (const AdamWTensor& t : tensors) {
    visit_floating(t.param->dtype(), "adamw", [&](auto tag) {
      using S = typename decltype(tag)::type;
      using C = compute_t<S>;
      S* p = t.param->data<S>();
      const S* g = t.grad->data<S>();
      S* m = t.exp_avg->data<S>();
      S* v = t.exp_avg_sq->data<S>();
      const double* values = a.values ? a.values->data<double>() : nullptr;
      const C decay = static_cast<C>(values ? (t.decays ? values[2] : 1.0) : t.decay), b1 = static_cast<C>(a.beta1),
              keep1 = static_cast<C>(1.0 - a.beta1), b2 = static_cast<C>(a.beta2),
              keep2 = static_cast<C>(1.0 - a.beta2), eps = static_cast<C>(a.eps),
              step_size = static_cast<C>(values ? values[0] : t.step_size),
              inv_bias2 = static_cast<C>(values ? values[1] : t.inv_bias2);
      const bool init = t.init;
      parallel_for(t.param->numel(), kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i)
          adamw_element<S, C>(p[i], g[i], m[i], v[i], decay, b1, keep1, b2, keep2, eps, step_size, inv_bias2, init);
      });
    });
  }
}

// loss-scale unscaling with the finite check in the same pass

void unscale_multi_tensor(const std::vector<Tensor*>& grads, double inv_scale, Tensor& found_inf) {
  std::atomic<bool> bad{false};
  for (Tensor* t : grads) {
    visit_floating(t->dtype(), "unscale", [&](auto tag) {
      using S = typename decltype(tag)::type;
      using C = compute_t<S>;
      S* g = t->data<S>();
      const C inv = static_cast<C>(inv_scale);
      parallel_for(t->numel(), kGrain, [&](int64_t lo, int64_t hi) {
        bool finite = true;
        for (int64_t i = lo; i < hi; ++i) {
          const C x = load_as<C>(g[i]) * inv;
          g[i] = store_as<S>(x);
          finite &= std::isfinite(load_as<C>(g[i]));
        }
        if (!finite) bad.store(true, std::memory_order_relaxed);
      });
    });
  }
  if (bad.load()) found_inf.data<float>()[0] = 1.0f;
}

// the exact gradient norm's two passes (integer maximum and sums: any split of the work gives the same bits)

void abs_max_multi_tensor(const std::vector<Tensor*>& grads, Tensor& out) {
  std::atomic<int32_t> top{out.data<int32_t>()[0]};
  for (Tensor* t : grads) {
    visit_floating(t->dtype(), "grad_norm", [&](auto tag) {
      using S = typename decltype(tag)::type;
      const S* g = t->data<S>();
      parallel_for(t->numel(), kGrain, [&](int64_t lo, int64_t hi) {
        uint32_t m = 0;
        for (int64_t i = lo; i < hi; ++i) m = std::max(m, abs_bits(g[i]));
        int32_t seen = top.load(std::memory_order_relaxed);
        while (static_cast<int32_t>(m) > seen && !top.compare_exchange_weak(seen, static_cast<int32_t>(m))) {
        }
      });
    });
  }
  out.data<int32_t>()[0] = top.load();
}

void square_sum_multi_tensor(const std::vector<Tensor*>& grads, double scale, Tensor& out) {
  std::atomic<uint64_t> low{0}, high{0};
  for (Tensor* t : grads) {
    visit_floating(t->dtype(), "grad_norm", [&](auto tag) {
      using S = typename decltype(tag)::type;
      const S* g = t->data<S>();
      parallel_for(t->numel(), kGrain, [&](int64_t lo, int64_t hi) {
        uint64_t l = 0, h = 0;  // each term is below 2^61: 2^32 terms fit either sum
        for (int64_t i = lo; i < hi; ++i) {
          const uint64_t v = fixed_square(g[i], scale);
          l += v & 0xffffffffu;
          h += v >> 32;
        }
        low.fetch_add(l, std::memory_order_relaxed);
        high.fetch_add(h, std::memory_order_relaxed);
      });
    });
  }
  auto* o = reinterpret_cast<uint64_t*>(out.data<int64_t>());
  o[0] += low.load();
  o[1] += high.load();
}

}  // namespace

void register_optim_kernels(KernelTable& t) {
  t.sgd_multi_tensor = &sgd_multi_tensor;
  t.adamw_multi_tensor = &adamw_multi_tensor;
  t.unscale_multi_tensor = &unscale_multi_tensor;
  t.abs_max_multi_tensor = &abs_max_multi_tensor;
  t.square_sum_multi_tensor = &square_sum_multi_tensor;
}

}  // namespace ringtrain::cpu
