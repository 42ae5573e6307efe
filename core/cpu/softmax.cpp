// core/cpu/softmax.cpp: the CPU (log-)softmax and fused softmax cross-entropy kernels, forward and
// backward, one row per task on the thread pool (core/parallel.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"
#include "core/parallel.h"

namespace ringtrain::cpu {
namespace {

void softmax(const Tensor& x, int64_t rows, int64_t cols, bool log, Tensor& out) {
  visit_floating(x.dtype(), "softmax", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* px = x.data<S>();
    S* po = out.data<S>();
    parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const S* in = px + r * cols;
        S* o = po + r * cols;
        C mx = -std::numeric_limits<C>::infinity();
        for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, load_as<C>(in[c]));
        C total = 0;
        for (int64_t c = 0; c < cols; ++c) total += std::exp(load_as<C>(in[c]) - mx);
        if (log) {
          const C lse = mx + std::log(total);
          for (int64_t c = 0; c < cols; ++c) o[c] = store_as<S>(load_as<C>(in[c]) - lse);
        } else {
          const C inv = C(1) / total;
          for (int64_t c = 0; c < cols; ++c) o[c] = store_as<S>(std::exp(load_as<C>(in[c]) - mx) * inv);
        }
      }
    });
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, int64_t rows, int64_t cols, bool log, Tensor& dx) {
  visit_floating(y.dtype(), "softmax_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S *py = y.data<S>(), *pdy = dy.data<S>();
    S* pdx = dx.data<S>();
    parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const S *yr = py + r * cols, *gr = pdy + r * cols;
        S* o = pdx + r * cols;
        C dot = 0;
        if (log) {
          for (int64_t c = 0; c < cols; ++c) dot += load_as<C>(gr[c]);
          for (int64_t c = 0; c < cols; ++c) o[c] = store_as<S>(load_as<C>(gr[c]) - std::exp(load_as<C>(yr[c])) * dot);
        } else {
          for (int64_t c = 0; c < cols; ++c) dot += load_as<C>(gr[c]) * load_as<C>(yr[c]);
          for (int64_t c = 0; c < cols; ++c) o[c] = store_as<S>(load_as<C>(yr[c]) * (load_as<C>(gr[c]) - dot));
        }
      }
    });
  });
}

template <typename Fn>
void visit_labels(const Tensor& labels, Fn&& fn) {
  if (labels.dtype() == DType::I32)
    fn(labels.data<int32_t>());
  else
    fn(labels.data<int64_t>());
}

// The label of row r as the kernels read it: ignored (-1 here), or in [0, cols).
template <typename L>
bool ignored(const CrossEntropyArgs& args, L label) {
  return args.has_ignore && static_cast<int64_t>(label) == args.ignore_index;
}

void cross_entropy(const Tensor& logits, const Tensor& labels, const CrossEntropyArgs& args, Tensor& log_probs,
                   Tensor& loss, Tensor& row_weight, Tensor& bad_row) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  bool all_valid = true;
  int64_t* bad = bad_row.data<int64_t>();
  *bad = rows;
  visit_labels(labels, [&](auto* lab) {
    for (int64_t r = 0; r < rows; ++r) {
      if ((lab[r] < 0 || lab[r] >= cols) && !ignored(args, lab[r])) {
        *bad = r;
        all_valid = false;
        return;
      }
    }
  });
  if (!all_valid) return;
  softmax(logits, rows, cols, /*log=*/true, log_probs);
  visit_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    using L = std::conditional_t<std::is_same_v<S, double>, double, float>;
    const S* lp = log_probs.data<S>();
    L* pl = loss.data<L>();
    L* pw = row_weight.data<L>();
    const L* wt = args.class_weight ? args.class_weight->data<L>() : nullptr;
    const C on = C(1) - static_cast<C>(args.smoothing), off = static_cast<C>(args.smoothing) / static_cast<C>(cols);
    visit_labels(labels, [&](auto* lab) {
      parallel_for(rows, std::max<int64_t>(1, kGrain / cols), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          if (ignored(args, lab[r])) {
            pl[r] = pw[r] = L(0);
            continue;
          }
          const S* row = lp + r * cols;
          C total = 0;
          if (wt) {
            for (int64_t c = 0; c < cols; ++c) total += static_cast<C>(wt[c]) * load_as<C>(row[c]);
            const C w = static_cast<C>(wt[lab[r]]);
            pl[r] = static_cast<L>(-on * w * load_as<C>(row[lab[r]]) - off * total);
            pw[r] = static_cast<L>(w);
          } else {
            for (int64_t c = 0; c < cols; ++c) total += load_as<C>(row[c]);
            pl[r] = static_cast<L>(-on * load_as<C>(row[lab[r]]) - off * total);
            pw[r] = L(1);
          }
        }
      });
    });
  });
}

void cross_entropy_backward(const Tensor& log_probs, const Tensor& labels, const CrossEntropyArgs& args, double scale,
                            Tensor& dlogits) {
  const int64_t rows = log_probs.size(0), cols = log_probs.size(1);
  visit_floating(log_probs.dtype(), "cross_entropy_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    using L = std::conditional_t<std::is_same_v<S, double>, double, float>;
    const S* lp = log_probs.data<S>();
    S* d = dlogits.data<S>();
    const L* wt = args.class_weight ? args.class_weight->data<L>() : nullptr;
    const C on = C(1) - static_cast<C>(args.smoothing), off = static_cast<C>(args.smoothing) / static_cast<C>(cols);
    const C sc = static_cast<C>(scale);
    C weight_sum = 0;
    if (wt)
      for (int64_t c = 0; c < cols; ++c) weight_sum += static_cast<C>(wt[c]);
    visit_labels(labels, [&](auto* lab) {
      parallel_for(rows, std::max<int64_t>(1, kGrain / cols), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          S* dr = d + r * cols;
          if (ignored(args, lab[r])) {
            for (int64_t c = 0; c < cols; ++c) dr[c] = store_as<S>(C(0));
            continue;
          }
          const S* row = lp + r * cols;
          if (wt) {
            const C w = static_cast<C>(wt[lab[r]]);
            for (int64_t c = 0; c < cols; ++c) {
              const C p = std::exp(load_as<C>(row[c]));
              const C hit = c == lab[r] ? C(1) : C(0);
              dr[c] = store_as<S>(sc * (on * w * (p - hit) + off * (p * weight_sum - static_cast<C>(wt[c]))));
            }
          } else {
            for (int64_t c = 0; c < cols; ++c) {
              C target = off + (c == lab[r] ? on : C(0));
              dr[c] = store_as<S>(sc * (std::exp(load_as<C>(row[c])) - target));
            }
          }
        }
      });
    });
  });
}

}  // namespace

void register_softmax_kernels(KernelTable& t) {
  t.softmax = &softmax;
  t.softmax_backward = &softmax_backward;
  t.cross_entropy = &cross_entropy;
  t.cross_entropy_backward = &cross_entropy_backward;
}

}  // namespace ringtrain::cpu
