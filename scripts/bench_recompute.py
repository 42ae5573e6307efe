#!/usr/bin/env python3
"""--recompute against the plain run: peak RSS and step time, measured in the same session.

  BUILD_DIR=build python3 scripts/bench_recompute.py [--rounds 2] [--arch resnet50] [--image-size 128] [-b 32]

Runs train_resnet on synthetic data, one process, plain and --recompute alternately (`--rounds` each), and
prints each run's peak RSS (the summary record's) and median step time, then the ratios of the medians.
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
          f"step time: {med['recompute'][1] / med['plain'][1]:.2f}x (goal <= 1.35x)")


if __name__ == "__main__":
    sys.exit(main())
