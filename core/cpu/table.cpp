// core/cpu/table.cpp: the CPU kernel table (core/kernels.h), assembled on first use from the op family
// files (core/cpu/<family>.cpp, declared in core/cpu/cpu_kernels.h). Kernels run on the thread pool
// (core/parallel.h) and never depend on the thread count: reductions use fixed-size blocks combined in a
// fixed order, and random kernels are counter-based.
#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"

namespace ringtrain {

const KernelTable& cpu_kernels() {
  // Built by explicit calls, not by static initializers in the family files (a static library would
  // drop the object files nothing else refers to, and their kernels with them).
  static const KernelTable table = [] {
    KernelTable t;
    cpu::register_elementwise_kernels(t);
    cpu::register_random_kernels(t);
    cpu::register_reduce_kernels(t);
    cpu::register_gemm_kernels(t);
    cpu::register_softmax_kernels(t);
    cpu::register_conv_kernels(t);
    cpu::register_norm_pool_kernels(t);
    cpu::register_optim_kernels(t);
    cpu::register_shape_kernels(t);
    cpu::register_activation_kernels(t);
    cpu::register_group_norm_kernels(t);
    cpu::register_resample_kernels(t);
    return t;
  }();
  return table;
}

}  // namespace ringtrain
