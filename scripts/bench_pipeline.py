#!/usr/bin/env python3
"""Pipeline stages: memory, efficiency against the ideal pipeline, and the balancer against an even split.

  BUILD_DIR=build python3 scripts/bench_pipeline.py [--out DIR] [--parts memory,efficiency,balance,cluster]

memory      ResNet-152, synthetic 64x64, AdamW, batch 16, 4 micro-batches: the largest rank's peak RSS with 2 and
            4 stages against one process (the run's summary record), with each stage's parameter, optimizer-state
            and activation bytes (plan and train records); then 1F1B against GPipe at 8 micro-batches (the
            activations each stage's steps held, measured by the allocator).
efficiency  2 stages, M = 4S = 8 micro-batches: the measured step time against the ideal
            (compute of the slowest stage per micro-batch) x (M + S - 1), per step (median over steps).
balance     the balancer's split (measured block times) against an even split of the blocks, same runs otherwise.
cluster     efficiency across 2 emulated nodes (scripts/cluster.sh, root), one stage per node.

Ranks run one compute thread each; use no more stages than cores (this script's 4-stage runs are memory
runs, where time does not matter). Writes DIR/summary.md and the runs' JSONL records.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD_DIR", "build"))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def sh(cmd, timeout, log):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"timed out after {timeout} s: {shlex.join(cmd)}\n{(e.output or '')[-2000:]}") from None
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(cmd)}   # {time.time() - t0:.1f} s, exit {p.returncode}\n{p.stdout}\n")
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {shlex.join(cmd)}\n{p.stdout[-3000:]}")
    return p.stdout


def records(path):
    return [json.loads(line) for line in open(path)]


def train(out, name, np, args, launcher=None, timeout=900):
    """Runs train_resnet on np ranks with --log-jsonl; returns its records."""
    jsonl = os.path.join(out, name + ".jsonl")
    if os.path.exists(jsonl):
        os.remove(jsonl)
    prog = [os.path.join(BUILD, "train_resnet"), "--synthetic", "--threads", "1", "--log-every", "1",
            "--log-jsonl", jsonl, *args]
    cmd = (launcher or ["mpirun", "-np", str(np), "--bind-to", "none"]) + prog
    sh(cmd, timeout, os.path.join(out, "runs.log"))
    return records(jsonl)


def mib(b):
    return f"{b / 2**20:.0f} MiB"


def memory(out, rows):
    common = ["-a", "resnet152", "--image-size", "64", "-b", "16", "--optimizer", "adamw", "--lr", "0.001",
              "--steps", "3", "--synthetic-size", "256"]
    one = train(out, "mem1", 1, common + ["--accum-steps", "4"])
    one_summary = next(r for r in one if r["type"] == "summary")
    base = max(one_summary["peak_mem_bytes_by_rank"])
    rows.append("## Memory: ResNet-152, 64x64, AdamW, batch 16, 4 micro-batches\n")
    rows.append(f"one process: peak RSS {mib(base)}, median step {one_summary['median_step_s']:.2f} s (4-stage runs "
                f"share {os.cpu_count()} cores: their times are not speeds)\n")
    rows.append("| stages | balance | largest rank's peak RSS | / one process | median step (s) | per stage: "
                "parameters, optimizer state, activations held |")
    rows.append("|---|---|---|---|---|---|")
    verdict = {}
    for stages in (2, 4):
        for balance, extra in (("memory", ["--pipeline-recompute"]), ("memory", ["--recompute"]), ("memory", []),
                               ("time", [])):
            name = f"mem{stages}{balance}{extra[0].lstrip('-') if extra else ''}"
            r = train(out, name, stages, common + ["--accum-steps", "4", "--pipeline-stages", str(stages),
                                                   "--pipeline-balance", balance, *extra])
            summary = next(x for x in r if x["type"] == "summary")
            plan = next(x for x in r if x["type"] == "plan")
            peak = max(summary["peak_mem_bytes_by_rank"])
            held = [max(t["activation_bytes"][s] for t in r if t["type"] == "train") for s in range(stages)]
            per = "; ".join(f"{mib(st['param_bytes'])}, {mib(plan['optimizer_state_bytes'][s])}, {mib(held[s])}"
                            for s, st in enumerate(plan["pipeline"]["stage"]))
            ratio = peak / base
            verdict[(stages, balance, extra[0] if extra else "")] = ratio
            label = balance + (", " + extra[0] if extra else "")
            rows.append(f"| {stages} | {label} (split {plan['pipeline']['split']}) | {mib(peak)} | {ratio:.2f} | "
                        f"{summary['median_step_s']:.2f} | {per} |")
    rows.append("")
    v = {k: f"{verdict[(2, 'memory', k)]:.2f} and {verdict[(4, 'memory', k)]:.2f}"
         for k in ("--pipeline-recompute", "--recompute", "")}
    rows.append(f"goal: <= 0.55 with 2 stages, <= 0.30 with 4: {v['--pipeline-recompute']} with --pipeline-recompute, "
                f"{v['--recompute']} with --recompute (each block's input kept), {v['']} without\n")
    # 1F1B against GPipe at 8 micro-batches: what each stage's steps held.
    rows.append("### Activations held: 1F1B against GPipe, 4 stages, 8 micro-batches of 16 (ResNet-152, 64x64)\n")
    rows.append("| stage | 1F1B | GPipe | 1F1B / GPipe |")
    rows.append("|---|---|---|---|")
    held = {}
    for sched in ("1f1b", "gpipe"):
        r = train(out, f"held{sched}", 4, common + ["--accum-steps", "8", "--pipeline-stages", "4",
                                                     "--pipeline-schedule", sched, "--pipeline-split", "0,6,20,42"])
        held[sched] = [max(t["activation_bytes"][s] for t in r if t["type"] == "train") for s in range(4)]
    for s in range(4):
        rows.append(f"| {s} | {mib(held['1f1b'][s])} | {mib(held['gpipe'][s])} | "
                    f"{held['1f1b'][s] / held['gpipe'][s]:.2f} |")
    rows.append(f"\n1F1B holds fewer in total: {sum(held['1f1b']) < sum(held['gpipe'])} "
                f"({mib(sum(held['1f1b']))} against {mib(sum(held['gpipe']))})\n")


def step_figures(recs, skip=2):
    """Median over steps (after `skip`): step time, the slowest stage's compute per step, the bubble."""
    train_recs = [t for t in recs if t["type"] == "train"][skip:]
    step = statistics.median(sum(t["time"].values()) for t in train_recs)
    slowest = statistics.median(max(t["busy_s"]) for t in train_recs)
    return step, slowest, train_recs


def efficiency_row(name, recs, stages, micro):
    step, slowest, _ = step_figures(recs)
    ideal = slowest / micro * (micro + stages - 1)
    return (f"| {name} | {stages} | {micro} | {step * 1e3:.1f} | {slowest * 1e3:.1f} | {ideal * 1e3:.1f} | "
            f"{ideal / step:.3f} | {(stages - 1) / (micro + stages - 1):.3f} |"), ideal / step


EFF_HEADER = ["| where | S | M | step (ms) | slowest stage's compute (ms) | ideal (ms) | ideal / step | ideal bubble |",
              "|---|---|---|---|---|---|---|---|"]
EFF_ARGS = ["-a", "resnet56", "-b", "32", "--steps", "12", "--synthetic-size", "4096"]


def efficiency(out, rows):
    rows.append("## Efficiency: ResNet-56, 32x32, batch 32, 2 stages, 8 micro-batches (M = 4S)\n")
    rows += EFF_HEADER
    r = train(out, "eff2", 2, EFF_ARGS + ["--accum-steps", "8", "--pipeline-stages", "2"])
    row, e = efficiency_row("one host", r, 2, 8)
    rows.append(row)
    rows.append(f"\ngoal >= 0.90: {e:.3f}\n")


def balance(out, rows):
    rows.append("## The balancer against an even split (2 stages, 8 micro-batches)\n")
    rows.append("| model | split | blocks per stage | per-stage compute (ms) | step (ms) |")
    rows.append("|---|---|---|---|---|")
    for model, args in (("resnet56 32x32 b32", EFF_ARGS), ("resnet50 64x64 b16", ["-a", "resnet50", "--image-size", "64",
                                                                                  "-b", "16", "--steps", "8",
                                                                                  "--synthetic-size", "4096"])):
        balanced = train(out, "bal_" + model.split()[0], 2, args + ["--accum-steps", "8", "--pipeline-stages", "2"])
        plan = next(x for x in balanced if x["type"] == "plan")["pipeline"]
        n = sum(len(s["blocks"]) for s in plan["stage"])
        even = f"0,{n // 2}"
        evened = train(out, "even_" + model.split()[0], 2, args + ["--accum-steps", "8", "--pipeline-stages", "2",
                                                                   "--pipeline-split", even])
        for label, r in (("balanced " + plan["split"], balanced), ("even " + even, evened)):
            step, _, recs = step_figures(r)
            p = next(x for x in r if x["type"] == "plan")["pipeline"]
            busy = [statistics.median(t["busy_s"][s] for t in recs) * 1e3 for s in range(2)]
            rows.append(f"| {model} | {label} | {', '.join(str(len(s['blocks'])) for s in p['stage'])} | "
                        f"{busy[0]:.1f}, {busy[1]:.1f} | {step * 1e3:.1f} |")
    rows.append("")


def cluster(out, rows):
    if os.geteuid() != 0:
        rows.append("## Across 2 emulated nodes: skipped (scripts/cluster.sh needs root)\n")
        return
    log = os.path.join(out, "runs.log")
    sh([CLUSTER, "down"], 120, log)
    try:
        sh([CLUSTER, "up", "2", "--slots", "1", "--rate", "10gbit"], 120, log)
        rows.append("## Efficiency across 2 emulated nodes (one stage each, 10 Gbit/s link; the same runs)\n")
        rows += EFF_HEADER
        r = train(out, "eff2_cluster", 2, EFF_ARGS + ["--accum-steps", "8", "--pipeline-stages", "2"],
                  launcher=[CLUSTER, "run", "-np", "2", "--"])
        plan = next(x for x in r if x["type"] == "plan")
        assert plan["nodes"] == 2, plan
        row, e = efficiency_row("2 nodes", r, 2, 8)
        rows.append(row)
        rows.append(f"\ngoal >= 0.90: {e:.3f}\n")
    finally:
        sh([CLUSTER, "down"], 120, log)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-pipeline")
    ap.add_argument("--parts", default="memory,efficiency,balance,cluster")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cpu = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    rows = [f"# Pipeline benchmark ({time.strftime('%Y-%m-%d')}, {model}, {os.cpu_count()} cores)\n"]
    for part in a.parts.split(","):
        {"memory": memory, "efficiency": efficiency, "balance": balance, "cluster": cluster}[part](a.out, rows)
    text = "\n".join(rows) + "\n"
    open(os.path.join(a.out, "summary.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
