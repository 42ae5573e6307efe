"""Peer for scripts/gpu_check.sh: what `train_resnet --synthetic` does, in PyTorch eager. torchvision ResNet,
channels_last, bf16 autocast (or fp16 with a GradScaler, or fp32), SGD (lr 0.1, momentum 0.9, weight decay
5e-4, train_resnet's defaults) on one fixed random batch resident on the device, 1000 classes.
  python3 scripts/peers/torch_gpu_peer.py [-a resnet50] [-b 256] [--steps 60] [--precision bf16] [--device cuda]
                                    [--hw 224] [--tf32 on|off] [--json FILE]
                                    [--profile-steps N --profile-json FILE]
Every step is synchronised and timed; prints one line and (with --json) writes one JSON object:
median_step_s (over all steps but the first 5, or the first one when there are fewer than 10),
img_per_s (batch / median step), img_per_s_wall (all images / all steps' time), peak_gpu_mem_bytes
(max_memory_reserved; 0 on the CPU), versions, and the settings used.
--tf32 (default on, as ringtrain's --tf32): fp32 convolutions and matmuls may use TF32 tensor cores.
--profile-steps N: after the timed steps (which it leaves untouched), one warm-up and N more steps under
torch.profiler (CPU and CUDA activity); every CUDA kernel's time goes to one of ringtrain's profiler
families (scripts/peers/kernel_families.py: by the operator that launched it and the kernel's name), per
step, and the table is printed; --profile-json FILE writes it as ringtrain's profile record:
{"type": "profile", "framework": "pytorch", "device", "steps", "step_ms" (mean wall time of a profiled step,
synchronised at both ends), "median_step_ms", "kernel_ms" (all kernels' time per step), "kernels_per_step",
"covered_share" (kernel_ms / step_ms), "families": [{"family", "calls", "device_ms", "share"}] (per step;
share = device_ms / step_ms), "top_kernels": the 40 longest kernels with their families, "other_kernels":
those in no family, with the operators that launched them}."""
import argparse, json, os, statistics, sys, time

import torch
import torch.nn as nn
import torchvision

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("-a", "--arch", default="resnet50", choices=["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"])
p.add_argument("-b", "--batch-size", type=int, default=256)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
p.add_argument("--device", default="cuda")
p.add_argument("--hw", type=int, default=224)
p.add_argument("--json", default="")
p.add_argument("--tf32", default="on", choices=["on", "off"])
p.add_argument("--profile-steps", type=int, default=0)
p.add_argument("--profile-json", default="")
args = p.parse_args()
if args.batch_size < 1 or args.steps < 1 or args.hw < 32:
    sys.exit("torch_gpu_peer: --batch-size and --steps must be positive and --hw at least 32")
if args.profile_steps < 0 or (args.profile_json and args.profile_steps == 0):
    sys.exit("torch_gpu_peer: --profile-steps must be positive with --profile-json (and never negative)")
device = torch.device(args.device)
if device.type == "cuda" and not torch.cuda.is_available():
    sys.exit("torch_gpu_peer: --device cuda but PyTorch sees no GPU (torch %s, built for CUDA %s)" % (torch.__version__, torch.version.cuda))
cuda = device.type == "cuda"

torch.manual_seed(0)
tf32 = args.tf32 == "on"
# PyTorch 2.9+ has per-backend fp32_precision and refuses a mix of it and the legacy allow_tf32 flags.
# (Older versions raise AssertionError, not AttributeError, for an unknown attribute: hasattr() cannot ask.)
def has_fp32_precision():
    try:
        torch.backends.cuda.matmul.fp32_precision
        torch.backends.cudnn.conv.fp32_precision
        return True
    except (AttributeError, AssertionError):
        return False


if has_fp32_precision():
    torch.backends.cuda.matmul.fp32_precision = "tf32" if tf32 else "ieee"
    torch.backends.cudnn.conv.fp32_precision = "tf32" if tf32 else "ieee"
else:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
torch.backends.cudnn.benchmark = True  # what a tuned PyTorch script sets; ringtrain caches its own choice per shape
model = getattr(torchvision.models, args.arch)(num_classes=1000).to(device).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
loss_fn = nn.CrossEntropyLoss()
x = torch.randn(args.batch_size, 3, args.hw, args.hw, device=device).to(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (args.batch_size,), device=device)
dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
scaler = None
if args.precision == "fp16":  # torch.amp.GradScaler since PyTorch 2.3; torch.cuda.amp's before
    scaler = torch.amp.GradScaler(device.type) if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()


def sync():
    if cuda:
        torch.cuda.synchronize(device)


def train_step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        loss = loss_fn(model(x), y)
    if scaler:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    return loss


times, losses = [], []
if cuda:
    torch.cuda.reset_peak_memory_stats(device)
start = time.perf_counter()
for step in range(args.steps):
    t0 = time.perf_counter()
    loss = train_step()
    sync()
    times.append(time.perf_counter() - t0)
    losses.append(loss.item())
elapsed = time.perf_counter() - start
skip = 5 if args.steps >= 10 else 1 if args.steps > 1 else 0
median = statistics.median(times[skip:])
result = {
    "peer": "pytorch", "torch": torch.__version__, "cuda": torch.version.cuda,
    "cudnn": torch.backends.cudnn.version() if cuda else None,
    "gpu": torch.cuda.get_device_name(device) if cuda else None,
    "arch": args.arch, "batch": args.batch_size, "hw": args.hw, "steps": args.steps, "precision": args.precision,
    "tf32": tf32, "loss_scaling": scaler is not None,
    "device": str(device), "channels_last": True, "timed_steps": len(times) - skip,
    "median_step_s": median, "img_per_s": args.batch_size / median,
    "img_per_s_wall": args.batch_size * args.steps / elapsed, "elapsed_s": elapsed,
    "peak_gpu_mem_bytes": torch.cuda.max_memory_reserved(device) if cuda else 0,
    "peak_gpu_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else 0,
    "first_loss": losses[0], "last_loss": losses[-1],
}
if not all(map(lambda v: v == v and abs(v) != float("inf"), losses)):
    sys.exit("torch_gpu_peer: non-finite loss %s" % losses)
print("pytorch %s %s b%d %s: median_step_s=%.4f img_per_s=%.1f img_per_s_wall=%.1f peak_gpu_mem=%.2f GiB loss %.3f -> %.3f"
      % (args.arch, args.device, args.batch_size, args.precision, median, result["img_per_s"], result["img_per_s_wall"],
         result["peak_gpu_mem_bytes"] / 2**30, losses[0], losses[-1]))
if args.json:
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


def is_cuda_event(e):
    return str(getattr(e, "device_type", "")).split(".")[-1] == "CUDA"


def profile_families(n):
    """n steps under torch.profiler (after one warm-up step under it): the profile record."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kernel_families
    from collections import defaultdict
    from torch.profiler import ProfilerActivity, profile, schedule
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    captured, step_times = [], []
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=n, repeat=1),
                 on_trace_ready=lambda prof: captured.append(prof.events())) as prof:
        for i in range(n + 1):
            sync()
            t0 = time.perf_counter()
            train_step()
            sync()
            if i > 0:
                step_times.append(time.perf_counter() - t0)
            prof.step()
    events = captured[-1] if captured else prof.events()
    # The operators behind each kernel: profiler_util links a kernel to the CPU operator that launched it
    # (FunctionEvent.kernels); its parents give the operator stack, outermost first. Every CUDA event of
    # the trace is counted; the links only attach the operators, matched by (name, duration).
    stacks = defaultdict(list)
    for e in events:
        # operators only (aten::..., not the CUDA runtime's cudaLaunchKernel, whose ids are another count)
        if is_cuda_event(e) or getattr(e, "is_legacy", False) or not getattr(e, "kernels", None) or "::" not in e.name:
            continue
        ops, p = [], e
        while p is not None:
            ops.append(p.name)
            p = getattr(p, "cpu_parent", None)
        ops.reverse()
        for k in e.kernels:
            stacks[(k.name, k.duration)].append(ops)
    per_family = defaultdict(lambda: [0, 0.0])  # family -> [calls, us]
    per_kernel = defaultdict(lambda: [0, 0.0, ""])  # name -> [calls, us, family]
    linked, unmapped = 0, {}  # 'other' kernels: name -> [calls, us, operators]
    for e in events:
        if not is_cuda_event(e) or getattr(e, "is_user_annotation", False) or e.name.startswith("ProfilerStep#"):
            continue
        us = e.time_range.end - e.time_range.start
        found = stacks.get((e.name, us))
        ops = found.pop() if found else ()
        linked += bool(ops)
        fam = kernel_families.family(e.name, ops)
        per_family[fam][0] += 1
        per_family[fam][1] += us
        k = per_kernel[e.name]
        k[0] += 1
        k[1] += us
        k[2] = fam if k[2] in ("", fam) else "mixed"  # one kernel under operators of two families
        if fam == "other":
            u = unmapped.setdefault(e.name, [0, 0.0, list(ops)])
            u[0] += 1
            u[1] += us
    step_ms = 1e3 * statistics.mean(step_times)
    kernels = sum(c for c, _ in per_family.values())
    kernel_ms = sum(us for _, us in per_family.values()) / 1e3 / n
    families = [{"family": f, "calls": c / n, "device_ms": us / 1e3 / n, "share": us / 1e3 / n / step_ms}
                for f, (c, us) in sorted(per_family.items(), key=lambda kv: -kv[1][1])]
    top = [{"name": name[:300], "family": fam, "calls": c / n, "device_ms": us / 1e3 / n}
           for name, (c, us, fam) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:40]]
    return {"type": "profile", "framework": "pytorch", "torch": torch.__version__,
            "device": "cuda:%d" % torch.cuda.current_device() if cuda else str(device),
            "arch": args.arch, "batch": args.batch_size, "precision": args.precision, "tf32": tf32,
            "steps": n, "step_ms": step_ms, "median_step_ms": 1e3 * statistics.median(step_times),
            "kernel_ms": kernel_ms, "kernels_per_step": kernels / n,
            "kernels_with_operator": linked / n, "covered_share": kernel_ms / step_ms,
            "families": families, "top_kernels": top,
            "other_kernels": [{"name": name[:300], "operators": ops, "calls": c / n, "device_ms": us / 1e3 / n}
                              for name, (c, us, ops) in sorted(unmapped.items(), key=lambda kv: -kv[1][1])[:20]]}


if args.profile_steps:
    record = profile_families(args.profile_steps)
    print("pytorch profile %s b%d %s, %d steps: %.2f ms a step (median %.2f), kernels %.2f ms (%.0f a step, "
          "%.0f with their operator)" % (args.arch, args.batch_size, args.precision, record["steps"], record["step_ms"],
                                          record["median_step_ms"], record["kernel_ms"], record["kernels_per_step"],
                                          record["kernels_with_operator"]))
    print("%-12s %8s %9s %6s" % ("family", "calls", "GPU ms", "share"))
    for f in record["families"]:
        print("%-12s %8.0f %9.2f %5.1f%%" % (f["family"], f["calls"], f["device_ms"], 100 * f["share"]))
    if not cuda:
        print("(no CUDA device: no kernel times)")
    if args.profile_json:
        with open(args.profile_json, "w") as f:
            json.dump(record, f, indent=1)
