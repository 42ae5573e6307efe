"""Peer for scripts/gpu_check.sh: what `train_resnet --synthetic` does, in PyTorch eager. torchvision ResNet,
channels_last, bf16 autocast (or fp16 with a GradScaler, or fp32), SGD (lr 0.1, momentum 0.9, weight decay
5e-4, train_resnet's defaults) on one fixed random batch resident on the device, 1000 classes.
  python3 scripts/peers/torch_gpu_peer.py [-a resnet50] [-b 256] [--steps 60] [--precision bf16] [--device cuda]
                                    [--hw 224] [--json FILE]
Every step is synchronised and timed; prints one line and (with --json) writes one JSON object:
median_step_s (over all steps but the first 5, or the first one when there are fewer than 10),
img_per_s (batch / median step), img_per_s_wall (all images / all steps' time), peak_gpu_mem_bytes
(max_memory_reserved; 0 on the CPU), versions, and the settings used."""
import argparse, json, statistics, sys, time

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
args = p.parse_args()
if args.batch_size < 1 or args.steps < 1 or args.hw < 32:
    sys.exit("torch_gpu_peer: --batch-size and --steps must be positive and --hw at least 32")
device = torch.device(args.device)
if device.type == "cuda" and not torch.cuda.is_available():
    sys.exit("torch_gpu_peer: --device cuda but PyTorch sees no GPU (torch %s, built for CUDA %s)" % (torch.__version__, torch.version.cuda))
cuda = device.type == "cuda"

torch.manual_seed(0)
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


times, losses = [], []
if cuda:
    torch.cuda.reset_peak_memory_stats(device)
start = time.perf_counter()
for step in range(args.steps):
    t0 = time.perf_counter()
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
