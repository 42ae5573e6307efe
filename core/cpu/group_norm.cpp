// core/cpu/group_norm.cpp: group normalisation of x viewed as (n, s, c) -- GroupNorm on NHWC (s = H * W) and
// LayerNorm over the last dim (s = 1, one group) -- forward and backward, each one fused kernel. Each (n, group)
// is a task; its statistics are two passes (the mean, then the squared deviations from it) accumulated in f64
// over 16 lanes (lane = channel index within the group modulo 16, so the order never depends on the threads and
// the lanes vectorize), combined in lane order. The parameter gradients are column sums over the n x s rows in
// fixed blocks of rows, combined in block order.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"
#include "core/parallel.h"

namespace ringtrain::cpu {
namespace {

constexpr int kLanes = 16;
constexpr int64_t kRowBlock = 256;  // rows of the parameter gradients' column sums per block

// Sum over one group's values of f(x) (or f(x, dy) below): for each of the s pixels, the group's cg channels
// starting at `first` of a row of c; lane = channel % 16.
template <typename S, typename F>
double group_sum(const S* x, int64_t s, int64_t c, int64_t cg, F&& f) {
  double acc[kLanes] = {};
  for (int64_t i = 0; i < s; ++i) {
    const S* row = x + i * c;
    int64_t j = 0;
    for (; j + kLanes <= cg; j += kLanes)
      for (int k = 0; k < kLanes; ++k) acc[k] += f(load_as<double>(row[j + k]));
    for (int k = 0; j + k < cg; ++k) acc[k] += f(load_as<double>(row[j + k]));
  }
  double total = 0;
  for (double a : acc) total += a;
  return total;
}

template <typename S, typename F>
double group_sum2(const S* x, const S* dy, int64_t s, int64_t c, int64_t cg, F&& f) {
  double acc[kLanes] = {};
  for (int64_t i = 0; i < s; ++i) {
    const S* xr = x + i * c;
    const S* gr = dy + i * c;
    int64_t j = 0;
    for (; j + kLanes <= cg; j += kLanes)
      for (int k = 0; k < kLanes; ++k) acc[k] += f(load_as<double>(xr[j + k]), load_as<double>(gr[j + k]), j + k);
    for (int k = 0; j + k < cg; ++k) acc[k] += f(load_as<double>(xr[j + k]), load_as<double>(gr[j + k]), j + k);
  }
  double total = 0;
  for (double a : acc) total += a;
  return total;
}

// Tasks of about kGrain values.
int64_t task_grain(const GroupNormShape& g) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, g.s * (g.c / g.groups)));
}

void group_norm_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, const GroupNormShape& g, double eps,
                        Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t cg = g.c / g.groups, count = g.s * cg;
  RT_CHECK(g.n * g.s * g.c == x.numel() && cg * g.groups == g.c && count > 0, "group_norm: ", x.describe(), " is not (",
           g.n, ", ", g.s, ", ", g.c, ") in ", g.groups, " groups");
  visit_floating(x.dtype(), "group_norm", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    using P = std::conditional_t<std::is_same_v<S, double>, double, float>;  // parameters and statistics
    const S* px = x.data<S>();
    S* py = y.data<S>();
    const P* pg = gamma ? gamma->data<P>() : nullptr;
    const P* pb = beta ? beta->data<P>() : nullptr;
    P* pm = mean.data<P>();
    P* pr = rstd.data<P>();
    parallel_for(g.n * g.groups, task_grain(g), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t n = t / g.groups, first = (t % g.groups) * cg;
        const S* xs = px + n * g.s * g.c + first;
        const double m = group_sum(xs, g.s, g.c, cg, [](double v) { return v; }) / static_cast<double>(count);
        const double var =
            group_sum(xs, g.s, g.c, cg, [m](double v) { return (v - m) * (v - m); }) / static_cast<double>(count);
        const P mean_p = static_cast<P>(m), rstd_p = static_cast<P>(1.0 / std::sqrt(var + eps));
        pm[t] = mean_p;
        pr[t] = rstd_p;
        const C mc = static_cast<C>(mean_p), rc = static_cast<C>(rstd_p);
        S* ys = py + n * g.s * g.c + first;
        for (int64_t i = 0; i < g.s; ++i) {
          const S* xr = xs + i * g.c;
          S* yr = ys + i * g.c;
          if (pg) {
            for (int64_t j = 0; j < cg; ++j)
              yr[j] = store_as<S>((load_as<C>(xr[j]) - mc) * rc * static_cast<C>(pg[first + j]) +
                                  static_cast<C>(pb[first + j]));
          } else {
            for (int64_t j = 0; j < cg; ++j) yr[j] = store_as<S>((load_as<C>(xr[j]) - mc) * rc);
          }
        }
      }
    });
  });
}

void group_norm_backward(const Tensor& x, const Tensor& dy, const Tensor* gamma, const Tensor& mean, const Tensor& rstd,
                         const GroupNormShape& g, Tensor& dx, Tensor* dgamma, Tensor* dbeta) {
  const int64_t cg = g.c / g.groups, count = g.s * cg;
  RT_CHECK(g.n * g.s * g.c == x.numel() && dy.numel() == x.numel() && cg * g.groups == g.c,
           "group_norm_backward: ", x.describe(), " and ", dy.describe(), " are not (", g.n, ", ", g.s, ", ", g.c,
           ") in ", g.groups, " groups");
  visit_floating(x.dtype(), "group_norm_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    using P = std::conditional_t<std::is_same_v<S, double>, double, float>;
    const S *px = x.data<S>(), *pdy = dy.data<S>();
    S* pdx = dx.data<S>();
    const P* pg = gamma ? gamma->data<P>() : nullptr;
    const P *pm = mean.data<P>(), *pr = rstd.data<P>();
    // dx, task by task: the group's sums of g = dy * gamma and of g * xhat first.
    parallel_for(g.n * g.groups, task_grain(g), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t n = t / g.groups, first = (t % g.groups) * cg, base = n * g.s * g.c + first;
        const double m = static_cast<double>(pm[t]), r = static_cast<double>(pr[t]);
        auto weight = [&](int64_t j) { return pg ? static_cast<double>(pg[first + j]) : 1.0; };
        const double sum_g =
            group_sum2(px + base, pdy + base, g.s, g.c, cg, [&](double, double d, int64_t j) { return d * weight(j); });
        const double sum_gx = group_sum2(px + base, pdy + base, g.s, g.c, cg,
                                         [&](double v, double d, int64_t j) { return d * weight(j) * (v - m) * r; });
        const C a = static_cast<C>(sum_g / static_cast<double>(count));
        const C b = static_cast<C>(sum_gx / static_cast<double>(count));
        const C mc = static_cast<C>(pm[t]), rc = static_cast<C>(pr[t]);
        for (int64_t i = 0; i < g.s; ++i) {
          const S* xr = px + base + i * g.c;
          const S* gr = pdy + base + i * g.c;
          S* dr = pdx + base + i * g.c;
          for (int64_t j = 0; j < cg; ++j) {
            const C gj = load_as<C>(gr[j]) * (pg ? static_cast<C>(pg[first + j]) : C(1));
            const C xhat = (load_as<C>(xr[j]) - mc) * rc;
            dr[j] = store_as<S>(rc * (gj - a - xhat * b));
          }
        }
      }
    });
    if (!dgamma && !dbeta) return;
    // The parameter gradients: column sums over the n x s rows of dy * xhat and dy, in blocks of rows.
    const int64_t rows = g.n * g.s, blocks = (rows + kRowBlock - 1) / kRowBlock;
    std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(blocks, 1) * 2 * g.c), 0.0);
    parallel_for(blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t blk = lo; blk < hi; ++blk) {
        double* acc_gamma = partial.data() + blk * 2 * g.c;
        double* acc_beta = acc_gamma + g.c;
        for (int64_t row = blk * kRowBlock; row < std::min(rows, (blk + 1) * kRowBlock); ++row) {
          const int64_t n = row / g.s;
          for (int64_t grp = 0; grp < g.groups; ++grp) {
            const int64_t t = n * g.groups + grp, first = grp * cg;
            const double m = static_cast<double>(pm[t]), r = static_cast<double>(pr[t]);
            const S* xr = px + row * g.c + first;
            const S* gr = pdy + row * g.c + first;
            double* ag = acc_gamma + first;
            double* ab = acc_beta + first;
            for (int64_t j = 0; j < cg; ++j) {
              const double d = load_as<double>(gr[j]);
              ag[j] += d * (load_as<double>(xr[j]) - m) * r;
              ab[j] += d;
            }
          }
        }
      }
    });
    P* dg = dgamma ? dgamma->data<P>() : nullptr;
    P* db = dbeta ? dbeta->data<P>() : nullptr;
    for (int64_t ch = 0; ch < g.c; ++ch) {
      double sg = 0, sb = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        sg += partial[static_cast<size_t>(blk * 2 * g.c + ch)];
        sb += partial[static_cast<size_t>(blk * 2 * g.c + g.c + ch)];
      }
      if (dg) dg[ch] = static_cast<P>(sg);
      if (db) db[ch] = static_cast<P>(sb);
    }
  });
}

}  // namespace

void register_group_norm_kernels(KernelTable& t) {
  t.group_norm_forward = &group_norm_forward;
  t.group_norm_backward = &group_norm_backward;
}

}  // namespace ringtrain::cpu
