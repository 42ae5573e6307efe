"""The family of a PyTorch CUDA kernel, in ringtrain's profiler families (core/profile.h: conv_fwd, conv_dgrad,
conv_wgrad, bn_fwd, bn_bwd, elementwise, pool, loss, optimizer, cast_copy, reduce, gemm, data, allreduce,
random, other), so scripts/peers/torch_gpu_peer.py --profile-steps can put PyTorch's GPU time beside
ringtrain's --profile table. Imports no torch: scripts/gpu_check_report.py and the CPU CI use it as well.

  family(kernel_name, ops=()) -> str
    ops: the names of the operators the profiler saw launch the kernel, outermost first (e.g.
    ["aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution"]); may be empty.

ringtrain times whole operators (the outermost one of a thread), so the outermost operator with a family of
its own decides, as there: every kernel a forward convolution launches (cuDNN's input padding included) is
conv_fwd, everything nll_loss_backward launches (its zero fill included) is loss. Copy and cast kernels are
cast_copy wherever they run (autocast casts a convolution's weights inside its operator; ringtrain's casts
are kernel calls of their own). The backward of a
convolution is one operator for both gradients; there the kernel's name decides: cuDNN's and CUTLASS's
kernels name their direction (sm90_xmma_wgrad_..., sm90_xmma_dgrad_..., ...Conv2dWgrad..., s16816dgrad),
other compute kernels (an fprop or GEMM kernel run for the data gradient) are conv_dgrad, and the helpers
that name neither (memsets, input padding, split-K workspaces) are conv_wgrad: in ResNet they serve the
weight gradient (the first convolution's padded input needs no data gradient; split-K is wgrad's). cuDNN
runs 1x1 convolutions as cuBLAS GEMMs (nvjet_*, ~50 a step in ResNet-50): under a convolution's operator they
are the convolution's; in its backward a split-K GEMM (and cublasLt's splitKreduce) is the weight gradient,
which reduces over N*H*W, and any other GEMM the data gradient. Without the operators they count as gemm.
Without an operator (or under one without a family: aten::add_, aten::sum), the kernel's name decides.

  python3 scripts/peers/kernel_families.py --self-test [TSV]
    checks the mapping on known kernel names (and, given a torch_prof_*.tsv, that its kernels fall in no
    'other' beyond the expected); prints "kernel_families: self-test passed"."""
import sys

FAMILIES = ("conv_fwd", "conv_dgrad", "conv_wgrad", "bn_fwd", "bn_bwd", "norm_fwd", "norm_bwd", "activation",
            "elementwise", "pool", "resample", "move", "loss", "optimizer", "cast_copy", "reduce", "gemm", "data",
            "allreduce", "random", "other")

# Operators, by their name without the namespace ("aten::cudnn_convolution" -> "cudnn_convolution"), lower case.
# Checked in this order; a rule matches when the name equals it or (for entries ending in '*') starts with it.
_OP_RULES = (
    ("cudnn_convolution_backward_input", "conv_dgrad"),  # before PyTorch 1.11: one operator per gradient
    ("cudnn_convolution_backward_weight", "conv_wgrad"),
    ("convolution_backward*", "conv_bwd"),  # aten::convolution_backward, convolution_backward_overrideable
    ("cudnn_convolution_backward", "conv_bwd"),
    ("conv2d", "conv_fwd"), ("convolution", "conv_fwd"), ("_convolution", "conv_fwd"),
    ("cudnn_convolution*", "conv_fwd"), ("conv_depthwise2d*", "conv_fwd"),
    ("native_batch_norm_backward", "bn_bwd"), ("cudnn_batch_norm_backward", "bn_bwd"),
    ("batch_norm_backward*", "bn_bwd"), ("miopen_batch_norm_backward", "bn_bwd"),
    ("batch_norm*", "bn_fwd"), ("_batch_norm*", "bn_fwd"), ("native_batch_norm", "bn_fwd"),
    ("cudnn_batch_norm", "bn_fwd"), ("_native_batch_norm_legit*", "bn_fwd"),
    ("native_layer_norm_backward", "norm_bwd"), ("layer_norm_backward*", "norm_bwd"),
    ("native_group_norm_backward", "norm_bwd"), ("group_norm_backward*", "norm_bwd"),
    ("layer_norm", "norm_fwd"), ("native_layer_norm", "norm_fwd"), ("group_norm", "norm_fwd"),
    ("native_group_norm", "norm_fwd"),
    ("gelu*", "activation"), ("silu*", "activation"), ("hardswish*", "activation"), ("hardsigmoid*", "activation"),
    ("hardtanh*", "activation"), ("relu6", "activation"), ("leaky_relu*", "activation"), ("clamp*", "activation"),
    ("max_pool2d*", "pool"), ("avg_pool2d*", "pool"), ("adaptive_avg_pool2d*", "pool"),
    ("_adaptive_avg_pool2d*", "pool"), ("adaptive_max_pool2d*", "pool"),
    ("upsample_*", "resample"),
    ("cat", "move"), ("permute", "move"), ("narrow", "move"), ("split*", "move"), ("chunk", "move"),
    ("cross_entropy_loss", "loss"), ("nll_loss*", "loss"), ("log_softmax*", "loss"), ("_log_softmax*", "loss"),
    ("softmax*", "loss"), ("_softmax*", "loss"),
    ("_foreach_*", "optimizer"), ("_fused_sgd*", "optimizer"), ("_amp_*", "optimizer"),
    ("linear", "gemm"), ("addmm", "gemm"), ("mm", "gemm"), ("matmul", "gemm"), ("bmm", "gemm"),
    ("to", "cast_copy"), ("_to_copy", "cast_copy"), ("copy_", "cast_copy"), ("clone", "cast_copy"),
    ("contiguous", "cast_copy"), ("_copy_from*", "cast_copy"),
)


def op_family(op):
    """The family an operator's kernels belong to, None when its kernels' names should decide.
    'conv_bwd' for the backward of a convolution (both gradients in one operator)."""
    o = op.strip().lower()
    if o.startswith("optimizer.step") or o.startswith("optimizer.") and ".step" in o:
        return "optimizer"  # the user annotation around torch.optim's step ("Optimizer.step#SGD.step")
    if "::" not in o:
        return None  # user annotations (ProfilerStep#3), autograd::engine::evaluate_function: ... have no family
    ns, name = o.split("::", 1)
    if ns not in ("aten", "cudnn", "torchvision", "c10d"):
        return None
    if ns == "c10d":
        return "allreduce"
    for rule, fam in _OP_RULES:
        if name == rule or (rule.endswith("*") and name.startswith(rule[:-1])):
            return fam
    return None


# Kernel names, lower case: (substrings, family), the first match wins.
_NAME_RULES = (
    # batch norm first: its kernels' names hold "elementwise" (unrolled_elementwise_kernel_for_multi_outputs
    # <..batch_norm_update_stats_and_invert..>) and "reduce" (batch_norm_backward_reduce)
    (("batch_norm_backward", "batch_norm_elementwise_backward", "bn_bw", "bn_bwd", "batchnorm_bwd",
      "batch_norm_reduce_statistics_kernel_backward"), "bn_bwd"),
    (("batch_norm", "batchnorm", "bn_fw", "bn_fwd", "welford"), "bn_fwd"),
    (("max_pool", "avg_pool", "maxpool", "avgpool", "adaptive_average_pool", "adaptive_max_pool", "pooling"), "pool"),
    (("softmax", "nll_loss", "cross_entropy", "crossentropy"), "loss"),
    (("multi_tensor_apply", "sgd", "adam", "fused_optim", "amp_update_scale", "non_finite_check_and_unscale",
      "_amp_foreach"), "optimizer"),
    (("nccl", "allreduce", "all_reduce"), "allreduce"),
    (("philox", "curand", "distribution_elementwise", "uniform_", "normal_", "bernoulli", "randperm",
      "fused_dropout"), "random"),
    (("nvjet", "gemm", "cublas", "cutlass", "sm90_xmma", "sm80_xmma", "ampere_", "hopper_", "volta_", "turing_",
      "s884", "s1688", "s16816", "h16816"), "gemm"),
    (("reduce_kernel", "reduce_kernel_", "reduction", "splitkreduce"), "reduce"),
    (("copy_kernel", "direct_copy", "memcpy", "to_copy", "nchwtonhwc", "nhwctonchw", "transpose", "cat_array",
      "catarray", "bfloat16_copy", "float16_copy", "half_copy"), "cast_copy"),
    # ATen's pointwise kernels are all vectorized_/unrolled_/elementwise_kernel<..Functor..>; no shorter words
    # ("add", "mul" match "nhwcAddPaddingKernel", "ImplicitGemmMultistage")
    (("elementwise", "memset", "fillfunctor", "fill_kernel", "relu", "threshold", "clamp_"), "elementwise"),
)
_CONV_WORDS = ("conv", "implicit_gemm", "implicit_convolve", "winograd", "fft2d", "fft_", "nhwcaddpadding",
               "addpadding", "cudnn", "xmma", "cask")


def _by_name(n):
    # a convolution's direction, as cuDNN and CUTLASS name it (implicit-GEMM kernels would otherwise be gemm)
    if "wgrad" in n:
        return "conv_wgrad"
    if "dgrad" in n:
        return "conv_dgrad"
    if "fprop" in n:
        return "conv_fwd"
    for words, fam in _NAME_RULES:
        if fam == "gemm" and any(w in n for w in ("conv", "implicit_gemm", "nhwckrsc")):
            continue  # an implicit-GEMM convolution that names no direction: below
        if any(w in n for w in words):
            return fam
    if any(w in n for w in _CONV_WORDS):
        return "conv_fwd"  # a convolution kernel that names no direction, launched outside any operator
    return None


_CAST_WORDS = ("copy_kernel", "direct_copy", "bfloat16_copy", "float16_copy", "half_copy", "memcpy")


def family(name, ops=()):
    """The family of the kernel `name`, launched under the operators `ops` (outermost first)."""
    n = (name or "").lower()
    if any(w in n for w in _CAST_WORDS):
        return "cast_copy"  # autocast's casts run inside the operator that needs them; ringtrain's are their own
    for op in ops or ():
        fam = op_family(op)
        if fam is None:
            continue
        if fam == "conv_bwd":
            if "wgrad" in n:
                return "conv_wgrad"
            if "dgrad" in n:
                return "conv_dgrad"
            compute = ("fprop", "implicit_gemm", "implicit_convolve", "gemm", "nvjet", "cutlass", "winograd",
                       "fft", "conv")
            helper = ("memset", "padding", "workspace", "split_k", "splitk", "reduce", "nchwtonhwc", "nhwctonchw")
            if any(w in n for w in compute) and not any(w in n for w in helper):
                return "conv_dgrad"
            return "conv_wgrad"
        return fam
    return _by_name(n) or "other"


# ---------------------------------------------------------------------------------------------------
_CASES = (
    # (kernel name, ops outermost first, family): names from torch_prof_bf16.tsv (PyTorch 2.11, H200, cuDNN 9)
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_g1_"
     "execute_segment_k_off_kernel__5x_cudnn", (), "conv_fwd"),
    ("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", (), "conv_dgrad"),
    ("sm90_xmma_dgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_strided", (),
     "conv_dgrad"),
    ("sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_execute_split_k_kernel__5x_cudnn", (),
     "conv_wgrad"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8>", (),
     "conv_fwd"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816dgrad_optimized_bf16_128x128>", (), "conv_dgrad"),
    ("void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cudnn::implicit_gemm::"
     "wgrad_indexed::Warp_specialized_params<", (), "conv_wgrad"),
    # a mangled CUTLASS convolution: its iterators name the direction (Conv2dFprop...), but a truncated
    # name may not reach them; then the operator decides
    ("_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemm"
     "MultistageINS_4gemm9GemmShapeILi64ELi128ELi32EEENS4_34Conv2dFpropActivationTileAccessIteratorOptimized", (),
     "conv_fwd"),
    ("_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemmMult",
     ("aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution"), "conv_fwd"),
    ("_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemmMult",
     ("autograd::engine::evaluate_function: ConvolutionBackward0", "ConvolutionBackward0", "aten::convolution_backward"),
     "conv_dgrad"),
    ("void nhwcAddPaddingKernel<__nv_bfloat16, __nv_bfloat16, float, true, (cudnnKernelDataType_t)0>(int, int",
     ("aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution"), "conv_fwd"),
    ("void nhwcAddPaddingKernel<__nv_bfloat16, __nv_bfloat16, float, true, (cudnnKernelDataType_t)0>(int, int",
     ("autograd::engine::evaluate_function: ConvolutionBackward0", "aten::convolution_backward"), "conv_wgrad"),
    ("void nhwcAddPaddingKernel<__nv_bfloat16, __nv_bfloat16, float, true, (cudnnKernelDataType_t)0>(int, int", (),
     "conv_fwd"),
    ("Memset (Device)", ("autograd::engine::evaluate_function: ConvolutionBackward0", "aten::convolution_backward"),
     "conv_wgrad"),
    ("Memset (Device)", (), "elementwise"),
    ("void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::Var, c10::BFloat16, float, 4>",
     (), "bn_fwd"),
    ("void at::native::batch_norm_transform_input_channels_last_kernel<c10::BFloat16, float, float, 4>", (), "bn_fwd"),
    ("void at::native::(anonymous namespace)::unrolled_elementwise_kernel_for_multi_outputs<3, at::native::"
     "(anonymous namespace)::batch_norm_update_stats_an", (), "bn_fwd"),
    ("void at::native::batch_norm_backward_elemt_channels_last_kernel<4, c10::BFloat16, float, float>", (), "bn_bwd"),
    ("void at::native::batch_norm_backward_reduce_channels_last_kernel<4, c10::BFloat16, float, float>", (), "bn_bwd"),
    ("cudnn::bn_fw_tr_1C11_kernel_NCHW<__nv_bfloat16, float, int, 512, true, 1>", (), "bn_fwd"),
    ("cudnn::bn_bw_1C11_kernel_new<__nv_bfloat16, float, float2, 512, true, 1>", (), "bn_bwd"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<", (),
     "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::(anonymous namespace)::launch_clamp_scalar(", (),
     "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, std::array<char*, 1ul> >", (),
     "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<2, at::native::CUDAFunctorOnSelf_add<long>, std::array<char*",
     ("aten::add_",), "elementwise"),
    ("void at::native::(anonymous namespace)::max_pool_backward_nhwc<c10::BFloat16, float>(c10::BFloat16 const*", (),
     "pool"),
    ("void at::native::(anonymous namespace)::max_pool_forward_nhwc<c10::BFloat16, int>(c10::BFloat16 const*", (),
     "pool"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous", (),
     "loss"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, long>(float*, float*", (),
     "loss"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >",
     ("autograd::engine::evaluate_function: NllLossBackward0", "aten::nll_loss_backward", "aten::zero_",
      "aten::fill_"), "loss"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<2>, at::native::(anonymous nam", (), "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float>", (
        "Optimizer.step#SGD.step", "aten::_foreach_add_"), "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)",
     (), "cast_copy"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::",
     (), "cast_copy"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)",
     ("aten::conv2d", "aten::convolution", "aten::_convolution", "aten::to", "aten::_to_copy", "aten::copy_"),
     "cast_copy"),  # autocast's weight cast, inside the convolution's operator
    ("Memcpy DtoD (Device -> Device)", (), "cast_copy"),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::MeanOps<c10::BFloat16",
     (), "reduce"),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::MeanOps<c10::BFloat16",
     ("aten::adaptive_avg_pool2d", "aten::mean"), "pool"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", (), "gemm"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", ("aten::linear", "aten::addmm"), "gemm"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", ("aten::conv2d", "aten::convolution", "aten::_convolution",
                                                        "aten::cudnn_convolution"), "conv_fwd"),
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNN", ("aten::convolution_backward",), "conv_dgrad"),
    ("nvjet_sm90_tst_128x128_64x6_1x2_h_bz_splitK_NTT", ("aten::convolution_backward",), "conv_wgrad"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, float",
     ("aten::convolution_backward",), "conv_wgrad"),
    ("nvjet_sm90_tst_64x128_64x8_2x1_v_bz_NTN", ("autograd::engine::evaluate_function: AddmmBackward0", "aten::mm"),
     "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, float", (),
     "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel", (),
     "gemm"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", (), "allreduce"),
    ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, at::native::", (),
     "random"),
    ("some_kernel_nobody_knows", (), "other"),
    ("some_kernel_nobody_knows", ("ProfilerStep#3", "autograd::engine::evaluate_function: AddBackward0"), "other"),
)


def self_test(tsv=None):
    bad = []
    for name, ops, want in _CASES:
        got = family(name, ops)
        if got != want:
            bad.append("family(%r, %r) = %r, wanted %r" % (name[:90], list(ops), got, want))
        if got not in FAMILIES:
            bad.append("family(%r) = %r: not one of ringtrain's families" % (name[:90], got))
    for op, want in (("aten::cudnn_convolution", "conv_fwd"), ("aten::convolution_backward", "conv_bwd"),
                     ("aten::native_batch_norm_backward", "bn_bwd"), ("aten::batch_norm", "bn_fwd"),
                     ("aten::max_pool2d_with_indices_backward", "pool"), ("aten::add_", None), ("aten::sum", None),
                     ("aten::to", "cast_copy"), ("aten::topk", None), ("Optimizer.step#SGD.step", "optimizer"),
                     ("ProfilerStep#7", None), ("autograd::engine::evaluate_function: ConvolutionBackward0", None)):
        if op_family(op) != want:
            bad.append("op_family(%r) = %r, wanted %r" % (op, op_family(op), want))
    if tsv:
        # every kernel of a real profile (names only, no operators) lands in a family
        others = []
        with open(tsv, errors="replace") as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 4 and parts[0] != "name":
                    if family(parts[0]) == "other":
                        others.append(parts[0])
        if others:
            bad.append("%s: %d kernels in 'other': %s" % (tsv, len(others), "; ".join(o[:80] for o in others)))
    for b in bad:
        print("kernel_families: FAIL:", b)
    if bad:
        return 1
    print("kernel_families: self-test passed (%d kernel names%s)" % (len(_CASES), ", and " + tsv if tsv else ""))
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--self-test":
        sys.exit(self_test(sys.argv[2] if len(sys.argv) > 2 else None))
    if len(sys.argv) >= 2 and not sys.argv[1].startswith("-"):
        for kernel in sys.argv[1:]:
            print("%-12s %s" % (family(kernel), kernel))
        sys.exit(0)
    sys.exit("usage: python3 kernel_families.py --self-test [TORCH_PROF_TSV] | KERNEL_NAME...")
