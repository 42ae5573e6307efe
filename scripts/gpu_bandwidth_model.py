#!/usr/bin/env python3
"""Bytes that ringtrain's memory-bound GPU kernels move in one ResNet training step, and the time that
takes at a given bandwidth: the model docs/GPU.md compares with `--profile`'s measured families.

Per batch norm over an activation of n elements (e bytes each), as core/cuda/norm_pool.cu and
core/ops.cpp run it in training:
  bn_fwd       statistics: two reads of x (mean, then squared deviations); apply: read x (and the
               residual), write y
  bn_bwd       partial sums: read x and dy; dx: read x and dy, write dx
  elementwise  the ReLU-gradient mask where the backward cannot recompute it from x (BN + add + ReLU;
               before the fused CUDA backward also BN + ReLU): read dy and y, write the masked dy; the
               gradient of each block's input, the sum of its two branches': read two, write one
  pool         max pool forward: read x, write y and its int64 argmax; backward: read dy and argmax,
               write dx
The statistics' f64 partials and the per-channel kernels move C-sized arrays: left out (under 0.1%).

Usage: gpu_bandwidth_model.py [--model resnet50|resnet18] [--batch 256] [--image 224] [--dtype bf16]
                              [--bandwidth-tbs 4.3] [--json]
"""
import argparse
import json
import sys

DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


def bn_layers(model, image):
    """(name, H, W, C, kind) of every batch norm in ringtrain's ResNet (layers/models/resnet.cpp; the
    names are its modules', as --profile-layers prints them; torchvision's v1.5 shapes: the stride on
    the 3x3 convolution). kind: 'relu' (BN + ReLU), 'add_relu' (BN + residual + ReLU), 'plain' (the
    downsample's BN); and 'grad_sum', each block input's gradient sum (not a batch norm)."""
    h = image // 2  # the 7x7 stride-2 stem
    layers = [("bn1", h, h, 64, "relu")]
    h = h // 2  # max pool 3x3 stride 2
    bottleneck = model == "resnet50"
    blocks = [3, 4, 6, 3] if bottleneck else [2, 2, 2, 2]
    in_c = 64
    for stage, count in enumerate(blocks):
        planes = 64 << stage
        out_c = planes * 4 if bottleneck else planes
        for b in range(count):
            stride = 2 if stage > 0 and b == 0 else 1
            ho = h // stride
            name = f"layer{stage + 1}.{b}"
            if bottleneck:
                layers.append((name + ".bn1", h, h, planes, "relu"))
                layers.append((name + ".bn2", ho, ho, planes, "relu"))
                layers.append((name + ".bn3", ho, ho, out_c, "add_relu"))
            else:
                layers.append((name + ".bn1", ho, ho, planes, "relu"))
                layers.append((name + ".bn2", ho, ho, out_c, "add_relu"))
            if stride != 1 or in_c != out_c:
                layers.append((name + ".downsample.1", ho, ho, out_c, "plain"))
            # The block input's gradient: two branches summed (a read-read-write pass of the input's size).
            layers.append((name + ".input_grad", h, h, in_c, "grad_sum"))
            in_c, h = out_c, ho
    return layers


def model_bytes(model, batch, image, e, fused_relu_backward):
    """Bytes per family for one training step."""
    fam = {"bn_fwd": 0, "bn_bwd": 0, "elementwise": 0, "pool": 0}
    bn_count = 0
    for _, h, w, c, kind in bn_layers(model, image):
        n = batch * h * w * c
        if kind == "grad_sum":
            fam["elementwise"] += 3 * n * e
            continue
        bn_count += 1
        fam["bn_fwd"] += 2 * n * e + (3 if kind == "add_relu" else 2) * n * e
        fam["bn_bwd"] += 5 * n * e
        if kind == "add_relu" or (kind == "relu" and not fused_relu_backward):
            fam["elementwise"] += 3 * n * e
    stem = image // 2
    pooled = stem // 2
    n_in, n_out = batch * stem * stem * 64, batch * pooled * pooled * 64
    fam["pool"] = (n_in * e + n_out * (e + 8)) + (n_out * (e + 8) + n_in * e)
    return fam, bn_count


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["resnet50", "resnet18"], default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16")
    ap.add_argument("--bandwidth-tbs", type=float, default=4.3, help="attainable DRAM bandwidth, TB/s")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.image < 32 or a.image % 32 or a.bandwidth_tbs <= 0:
        ap.error("--batch must be >= 1, --image a multiple of 32 (>= 32), --bandwidth-tbs > 0")
    e = DTYPE_BYTES[a.dtype]
    before, bn_count = model_bytes(a.model, a.batch, a.image, e, fused_relu_backward=False)
    after, _ = model_bytes(a.model, a.batch, a.image, e, fused_relu_backward=True)
    ms = lambda b: b / (a.bandwidth_tbs * 1e12) * 1e3  # noqa: E731
    rows = [{"family": f, "gb_before": before[f] / 1e9, "gb_after": after[f] / 1e9, "ms_before": ms(before[f]),
             "ms_after": ms(after[f])} for f in before]
    total = {k: sum(r[k] for r in rows) for k in ("gb_before", "gb_after", "ms_before", "ms_after")}
    if a.json:
        print(json.dumps({"model": a.model, "batch": a.batch, "image": a.image, "dtype": a.dtype,
                          "bandwidth_tbs": a.bandwidth_tbs, "batch_norms": bn_count, "families": rows,
                          "total": total}, indent=1))
        return 0
    print(f"{a.model} {a.dtype} b{a.batch} {a.image}px: {bn_count} batch norms; time at {a.bandwidth_tbs} TB/s")
    print("| family | GB before | ms before | GB after | ms after |")
    print("|---|---:|---:|---:|---:|")
    for r in rows + [dict(family="total", **total)]:
        print(f"| {r['family']} | {r['gb_before']:.2f} | {r['ms_before']:.2f} | {r['gb_after']:.2f} | "
              f"{r['ms_after']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
