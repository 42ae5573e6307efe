#!/usr/bin/env python3
"""--recompute against the plain run: peak RSS and step time, measured in the same session.

  BUILD_DIR=build python3 scripts/bench_recompute.py [--rounds 2] [--arch resnet50] [--image-size 128] [-b 32]
                                                      [--pairs 10]

Peak RSS: train_resnet on synthetic data, one process, plain and --recompute alternately (`--rounds` each);
each run's peak RSS (the summary record's) and median step time, and the ratio of the peaks' medians.
Step time: the same runs' medians drift with the machine (a shared one varies by 30% between runs), so the
time goal is judged in one process instead: bench_step --recompute compare alternates plain and recomputed
steps (`--pairs` of them after one warm-up pair) and prints the median of each pair's ratio, once a round.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD_DIR", "build"))


def run(args, extra, jsonl):
    if os.path.exists(jsonl):
        os.remove(jsonl)
    cmd = [os.path.join(BUILD, "train_resnet"), "--synthetic", "-a", args.arch, "--image-size", str(args.image_size),
           "-b", str(args.batch), "--steps", str(args.steps), "--synthetic-size", "512", "--log-every", "1",
           "--log-jsonl", jsonl, *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    summary = [json.loads(line) for line in open(jsonl) if '"summary"' in line][-1]
    return summary["peak_mem_bytes"], summary["median_step_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("-b", "--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--pairs", type=int, default=10)
    a = ap.parse_args()
    cpu = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    print(f"# --recompute: {a.arch}, synthetic {a.image_size}x{a.image_size}, batch {a.batch}, one process "
          f"({model}, {os.cpu_count()} cores)\n")
    print("| run | round | peak RSS (MiB) | median step (s) |")
    print("|---|---|---|---|")
    got = {"plain": [], "recompute": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name, extra in (("plain", []), ("recompute", ["--recompute"])):
                peak, step = run(a, extra, os.path.join(tmp, name + ".jsonl"))
                got[name].append((peak, step))
                print(f"| {name} | {r + 1} | {peak / 2**20:.0f} | {step:.3f} |", flush=True)
    med = {k: (statistics.median(p for p, _ in v), statistics.median(s for _, s in v)) for k, v in got.items()}
    print(f"\npeak RSS: {med['recompute'][0] / med['plain'][0]:.2f} of the plain run's (goal <= 0.50); "
          f"step time across the runs: {med['recompute'][1] / med['plain'][1]:.2f}x\n")
    classes = "10" if a.arch in ("resnet20", "resnet32", "resnet44", "resnet56", "resnet110") else "1000"  # as train_resnet
    ratios = []
    print("| round | plain step (s) | recomputed step (s) | median pair ratio |")
    print("|---|---|---|---|")
    for r in range(a.rounds):
        out = subprocess.run([os.path.join(BUILD, "bench_step"), "-a", a.arch, "-b", str(a.batch), "--hw",
                              str(a.image_size), "--classes", classes, "--steps", str(a.pairs), "--warmup", "1",
                              "--recompute", "compare"], check=True, stdout=subprocess.PIPE, text=True,
                             timeout=3600).stdout
        f = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
        ratios.append(float(f["recompute_over_plain"]))
        print(f"| {r + 1} | {float(f['plain_median_step_s']):.3f} | {float(f['median_step_s']):.3f} | "
              f"{ratios[-1]:.3f} |", flush=True)
    print(f"\nstep time: {statistics.median(ratios):.2f}x the plain step's, median of the rounds' pair ratios "
          f"{min(ratios):.3f}-{max(ratios):.3f} (goal <= 1.35x)")

if __name__ == "__main__":
    sys.exit(main())
