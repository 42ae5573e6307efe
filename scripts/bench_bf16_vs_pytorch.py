#!/usr/bin/env python3
"""CPU mixed precision: ringtrain bf16 against PyTorch's autocast bf16, and both against their fp32.

  BUILD_DIR=build python3 scripts/bench_bf16_vs_pytorch.py [--rounds 3] [--steps 5] [--peer-python PY]
                                                           [--configs resnet20:32:128,resnet50:64:32] [--threads 1,2]

For each configuration (architecture:image side:batch) and thread count, one round times four programs
one after another: ringtrain's bench_step at fp32 and at --precision bf16, and the PyTorch peer
(scripts/peers/torch_resnet_step.py: the same ResNet, SGD step and batch, channels_last, eager) at fp32
and under torch.autocast("cpu", torch.bfloat16). The ratios are taken within a round (the programs ran
side by side in time), then their median over the rounds. The peer is PyTorch 2.15 from PyPI where
--peer-python (default /opt/torch2/bin/python) exists, else Debian's PyTorch 1.13:
  python3 -m venv /opt/torch2 && /opt/torch2/bin/pip install torch==2.15.0 numpy   (about 5.5 GB)

The goal: on a CPU with bf16 instructions (avx512_bf16 or AMX), ringtrain bf16 at most 0.85x
PyTorch's bf16 step and faster than ringtrain fp32. The header says which instructions this CPU has and
which path ringtrain's bf16 takes on it (core/cpu_features.h); without them it takes the f32 path, and
the table shows what that costs.
"""
import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD_DIR", "build"))
PEER = os.path.join(ROOT, "scripts", "peers", "torch_resnet_step.py")
CIFAR = ("resnet20", "resnet32", "resnet44", "resnet56", "resnet110")


def fields(out):
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def timed(cmd):
    """median_step_s of one run (None when it failed: the table shows '-') and its printed fields."""
    try:
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=900).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"# failed: {' '.join(cmd)}: {getattr(e, 'stderr', '') or e}", file=sys.stderr)
        return None, {}
    f = fields(out)
    return float(f["median_step_s"]), f


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--configs", default="resnet20:32:128,resnet50:64:32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--peer-python", default="/opt/torch2/bin/python")
    a = ap.parse_args()
    peer_python = a.peer_python if os.path.exists(a.peer_python) else "/usr/bin/python3"
    version = subprocess.run([peer_python, "-c", "import torch; print(torch.__version__, "
                              "getattr(getattr(torch.backends, 'cpu', None), 'get_cpu_capability', lambda: '?')())"],
                             stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    lscpu = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith("Model name")), "?")
    env = subprocess.run([os.path.join(BUILD, "ringtrain_env")], stdout=subprocess.PIPE, text=True).stdout
    print(f"# CPU: {model}, {os.cpu_count()} cores; PyTorch {version[0]} (CPU capability {version[1]}), "
          f"channels_last eager; {a.rounds} interleaved rounds of {a.steps} steps")
    for line in env.splitlines():
        if line.startswith("cpu instructions") or "--precision bf16 on the cpu" in line:
            print("# " + line.strip())
    configs = [c.split(":") for c in a.configs.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    got = {}  # (config, threads) -> list of rounds, each {program: seconds}
    path = "?"
    for _ in range(a.rounds):
        for arch, side, batch in configs:
            classes = "10" if arch in CIFAR else "1000"
            for t in threads:
                ours = [os.path.join(BUILD, "bench_step"), "-a", arch, "--hw", side, "-b", batch, "--classes", classes,
                        "--threads", str(t), "--steps", str(a.steps)]
                torch = [peer_python, PEER, "-a", arch, "--hw", side, "-b", batch, "--classes", classes, "--threads",
                         str(t), "--steps", str(a.steps), "--format", "cl"]
                r = {}
                r["ours fp32"], _ = timed(ours)
                r["ours bf16"], f = timed(ours + ["--precision", "bf16"])
                path = f.get("cpu_half_path", path)
                r["torch fp32"], _ = timed(torch)
                r["torch bf16"], _ = timed(torch + ["--precision", "bf16"])
                got.setdefault((arch, side, batch, t), []).append(r)
                print(f"# {arch} {side}px b{batch} threads={t}: " +
                      ", ".join(f"{k} {v:.4f} s" if v else f"{k} -" for k, v in r.items()), flush=True)
    print(f"\nringtrain bf16 took the {path} path.\n")
    print("| model | threads | ringtrain fp32 (s) | ringtrain bf16 (s) | PyTorch fp32 (s) | PyTorch bf16 (s) | "
          "ours bf16 / PyTorch bf16 (goal <= 0.85) | ours bf16 / ours fp32 (goal < 1) |")
    print("|---|---|---|---|---|---|---|---|")

    def med(rounds, key):
        xs = [r[key] for r in rounds if r[key]]
        return f"{statistics.median(xs):.4f}" if xs else "-"

    def ratio(rounds, top, bottom):
        xs = [r[top] / r[bottom] for r in rounds if r[top] and r[bottom]]
        return f"{statistics.median(xs):.2f}" if xs else "-"

    met = True
    for (arch, side, batch, t), rounds in got.items():
        vs_torch, vs_fp32 = ratio(rounds, 'ours bf16', 'torch bf16'), ratio(rounds, 'ours bf16', 'ours fp32')
        print(f"| {arch} {side}px b{batch} | {t} | {med(rounds, 'ours fp32')} | {med(rounds, 'ours bf16')} | "
              f"{med(rounds, 'torch fp32')} | {med(rounds, 'torch bf16')} | {vs_torch} | {vs_fp32} |")
        met = met and vs_torch != "-" and vs_fp32 != "-" and float(vs_torch) <= 0.85 and float(vs_fp32) < 1
    print(f"\ngoals (bf16 <= 0.85x PyTorch's bf16 and faster than ringtrain fp32, every configuration): "
          f"{'met' if met else 'NOT met'} on the {path} path")


if __name__ == "__main__":
    sys.exit(main())
