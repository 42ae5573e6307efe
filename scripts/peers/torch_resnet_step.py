"""Peer for scripts/bench_vs_pytorch.sh, bench_families.sh and bench_loader.sh: PyTorch's CPU (or GPU)
training-step time of the model that ringtrain's bench_step times, SGD lr 0.1 momentum 0.9 weight decay 5e-4 on
one fixed random batch. The ResNets are scripts/peers/models.py's (same layers, same shapes); mobilenet_v2,
efficientnet_b0..b7 and convnext_* are torchvision's (needs torchvision beside the peer's torch); unet and unet_gn
are scripts/make_goldens.py's PyTorch UNet, ringtrain's layers/models/unet.h (per-pixel cross-entropy). Runs on Debian's PyTorch 1.13 (/usr/bin/python3)
and on PyTorch 2.x from PyPI (a venv outside the repository: python3 -m venv /opt/torch2 &&
/opt/torch2/bin/pip install torch==2.15.0 numpy).
  python3 scripts/peers/torch_resnet_step.py -a resnet20 -b 128 --threads 1 [--steps 5] [--hw 32] [--channels 3]
      [--format nchw|cl] [--mode eager|compile] [--precision fp32|bf16] [--classes 10]
--format cl: channels_last (the fastest CPU layout); --mode compile: torch.compile (PyTorch 2 only);
--precision bf16: torch.autocast("cpu", torch.bfloat16) around forward and loss.
Prints one line: "torch VERSION ARCH bB HWxHWxC FORMAT MODE PRECISION threads=T median_step_s=S img_per_s=R
params=P" (median of --steps timed steps after 2 warm-ups, 3 with compile; P: the parameter count, the same
as ringtrain's bench_step prints for the architecture; tests/apps/peer_model.sh holds them equal)."""
import argparse, os, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import resnet  # noqa: E402


def build(arch, channels, classes):
    """The model and whether it predicts a class per pixel."""
    if arch.startswith("resnet"):
        return resnet(arch, channels, classes), False
    if arch in ("unet", "unet_gn"):
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from make_goldens import UNet
        torch.set_default_dtype(torch.float32)  # make_goldens switches the default to float64 on import
        return UNet(channels, classes, groups=8 if arch == "unet_gn" else 0), True
    import torchvision
    if not hasattr(torchvision.models, arch):
        sys.exit(f"torch_resnet_step: unknown architecture '{arch}'")
    m = getattr(torchvision.models, arch)(num_classes=classes)
    if channels != 3:
        sys.exit("torch_resnet_step: torchvision's models take 3 channels")
    return m, False


p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("-a", "--arch", default="resnet20")
p.add_argument("-b", "--batch-size", type=int, default=128)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--hw", type=int, default=0, help="image side (0: 32 for CIFAR ResNets, 224 otherwise)")
p.add_argument("--channels", type=int, default=3)
p.add_argument("--classes", type=int, default=10, help="classes (10, as bench_step)")
p.add_argument("--format", default="nchw", choices=["nchw", "cl"])
p.add_argument("--mode", default="eager", choices=["eager", "compile"])
p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
a = p.parse_args()
if a.batch_size < 1 or a.steps < 1 or a.threads < 1:
    sys.exit("torch_resnet_step: -b, --steps and --threads must be positive")
if a.mode == "compile" and not hasattr(torch, "compile"):
    sys.exit(f"torch_resnet_step: --mode compile needs PyTorch 2 (this is {torch.__version__})")
torch.set_num_threads(a.threads); torch.manual_seed(0)
m, per_pixel = build(a.arch, a.channels, a.classes)
hw = a.hw or (32 if a.arch.startswith("resnet") and m.fc.in_features == 64 else 224)
x = torch.randn(a.batch_size, a.channels, hw, hw)
y = torch.randint(0, a.classes, (a.batch_size, hw, hw) if per_pixel else (a.batch_size,))
if a.format == "cl":
    m = m.to(memory_format=torch.channels_last); x = x.contiguous(memory_format=torch.channels_last)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)


def loss_of(x, y):
    if a.precision == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.cross_entropy(m(x), y)
    return F.cross_entropy(m(x), y)


fwd = torch.compile(loss_of) if a.mode == "compile" else loss_of


def step():
    opt.zero_grad(set_to_none=True); fwd(x, y).backward(); opt.step()


for _ in range(3 if a.mode == "compile" else 2): step()
t = []
for _ in range(a.steps):
    t0 = time.perf_counter(); step(); t.append(time.perf_counter() - t0)
t.sort(); med = t[len(t) // 2]
print(f"torch {torch.__version__} {a.arch} b{a.batch_size} {hw}x{hw}x{a.channels} {a.format} {a.mode} {a.precision} "
      f"threads={a.threads} median_step_s={med:.4f} img_per_s={a.batch_size / med:.1f} "
      f"params={sum(q.numel() for q in m.parameters())}")
