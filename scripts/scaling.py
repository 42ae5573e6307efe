#!/usr/bin/python3
"""Weak and strong scaling sweeps of train_resnet: runs, one CSV, PNG plots.

For every mode (weak: fixed batch per rank; strong: fixed global batch split over the ranks),
architecture, backend and world size it runs

    mpirun -np N [--oversubscribe] [--hostfile F] build/train_resnet --synthetic -a ARCH -b B \
        --steps S --threads T --backend BACKEND --log-jsonl OUT/runs/<mode>-<arch>-<backend>-npN.jsonl

(or `srun -n N --mpi=pmix ...` inside a Slurm allocation), reads each run's JSONL summary and writes

    OUT/scaling.csv          one row per run: throughput, efficiency, step-time breakdown, memory
    OUT/throughput.png       images/s vs ranks, with the ideal (linear) line
    OUT/efficiency.png       scaling efficiency vs ranks
    OUT/breakdown.png        stacked step time: data wait, forward, backward, exposed comm, optimizer

Throughput is global batch / median step time (the steady state, not the warm-up); efficiency is
throughput(N) / (N / N0 x throughput(N0)) against the smallest world size N0 of the same series.
With --allreduce-bench it also runs allreduce_bench at every world size (OUT/allreduce_npN.json) and
then `scripts/scaling_model.py selfcheck` on the weak series, so the model is checked against the runs.
A run whose JSONL already holds a summary for the same command is reused (an interrupted sweep
continues); --force reruns everything. A failed run is reported with its output and the sweep goes on;
the exit status is non-zero if any run failed.

Examples:
  scripts/scaling.py --out /tmp/sweep --ranks 1,2,4 --arch resnet20,resnet56 --steps 40
  scripts/scaling.py --out sweep --mode strong --global-batch 512 --ranks 1,2,4,8 --hostfile hosts
  (in an sbatch script) scripts/scaling.py --out sweep --ranks 8,16,32 --launcher srun --device cuda
"""
import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BREAKDOWN = ["data_wait", "forward", "backward", "exposed_comm", "optimizer"]
FIELDS = ["mode", "arch", "backend", "ranks", "nodes", "batch_per_rank", "global_batch", "threads", "steps", "repeats",
          "median_step_s", "img_per_s", "efficiency", "ideal_img_per_s"] + [f"{k}_s" for k in BREAKDOWN] + \
         ["peak_mem_bytes", "status", "jsonl", "command"]


def csv_list(kind):
    def parse(text):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty {kind} list")
        return items
    return parse


def int_list(text):
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got '{text}'")
    return sorted(set(values))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="output folder (created)")
    p.add_argument("--mode", choices=["weak", "strong", "both"], default="weak")
    p.add_argument("--ranks", type=int_list, default=None,
                   help="world sizes (default: 1,2,4,... up to the Slurm task count or the cores here)")
    p.add_argument("--arch", type=csv_list("arch"), default=["resnet20"], help="comma-separated (default resnet20)")
    p.add_argument("--backend", type=csv_list("backend"), default=["ring"],
                   help="comma-separated: ring,hierarchical,mpi,nccl,auto")
    p.add_argument("--batch", type=int, default=64, help="weak: images per rank (default 64)")
    p.add_argument("--global-batch", type=int, default=256, help="strong: images per step over all ranks (default 256)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per run (default 30)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per rank (default 1: comparable across N)")
    p.add_argument("--device", default="cpu", help="train_resnet --device (default cpu)")
    p.add_argument("--data", help="shard folder instead of --synthetic")
    p.add_argument("--extra", default="", help="more train_resnet flags, one string (e.g. '--image-size 16')")
    p.add_argument("--build", type=Path, default=ROOT / "build", help="folder with train_resnet (default build/)")
    p.add_argument("--launcher", choices=["auto", "mpirun", "srun"], default="auto",
                   help="auto: srun inside a Slurm allocation, mpirun otherwise")
    p.add_argument("--hostfile", help="mpirun --hostfile (multi-node without Slurm)")
    p.add_argument("--mpirun-args", default="", help="more mpirun flags, one string (e.g. '--bind-to core')")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run before it is killed (default 900)")
    p.add_argument("--allreduce-bench", action="store_true",
                   help="also run allreduce_bench per world size and check scripts/scaling_model.py against the runs")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every configuration this many times, interleaved, and report the median run (noisy machines)")
    p.add_argument("--force", action="store_true", help="rerun runs whose results exist")
    p.add_argument("--no-plots", action="store_true")
    a = p.parse_args(argv)
    for name in ("batch", "global_batch", "steps", "threads", "timeout", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(a, name)})")
    if a.data and not Path(a.data).is_dir():
        p.error(f"--data: shard folder '{a.data}' does not exist")
    if not (a.build / "train_resnet").is_file():
        p.error(f"--build: '{a.build / 'train_resnet'}' not found (run scripts/setup.sh first)")
    if a.launcher == "auto":
        a.launcher = "srun" if os.environ.get("SLURM_JOB_ID") else "mpirun"
    if a.ranks is None:
        limit = int(os.environ.get("SLURM_NTASKS", "0")) or (os.cpu_count() or 1)
        a.ranks = [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]
    if a.mode in ("strong", "both"):
        bad = [n for n in a.ranks if a.global_batch % n or a.global_batch < n]
        if bad:
            p.error(f"--global-batch {a.global_batch} does not split evenly over {bad} ranks (strong scaling)")
    return a


def launcher(a, n):
    if a.launcher == "srun":
        return ["srun", "-n", str(n), "--mpi=pmix", "--kill-on-bad-exit=1"]
    cmd = ["mpirun", "-np", str(n)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if a.hostfile:
        cmd += ["--hostfile", a.hostfile]
    elif n * a.threads > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    return cmd + shlex.split(a.mpirun_args)


def read_run(path):
    """The plan and summary records of the last complete run in a train_resnet JSONL file."""
    plan = summary = None
    records = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not JSON ({e})")
    for r in records:
        if r.get("type") == "plan":
            plan, summary = r, None
        elif r.get("type") == "summary":
            summary = r
    return plan, summary


def run_one(a, mode, arch, backend, n, runs_dir, rep):
    batch = a.batch if mode == "weak" else a.global_batch // n
    name = f"{mode}-{arch}-{backend}-np{n}" + (f"-r{rep}" if a.repeats > 1 else "")
    jsonl = runs_dir / f"{name}.jsonl"
    cmd = launcher(a, n) + [str(a.build / "train_resnet"), "-a", arch, "-b", str(batch), "--steps", str(a.steps),
                            "--threads", str(a.threads), "--backend", backend, "--device", a.device,
                            "--log-every", "1000000", "--timeout", str(a.timeout)]
    cmd += ["--data", a.data] if a.data else ["--synthetic"]
    cmd += shlex.split(a.extra)
    command_text = shlex.join(cmd)
    stamp = runs_dir / f"{name}.cmd"
    row = {"mode": mode, "arch": arch, "backend": backend, "ranks": n, "batch_per_rank": batch, "global_batch": batch * n,
           "threads": a.threads, "steps": a.steps, "repeats": 1, "jsonl": str(jsonl), "command": command_text}
    reuse = not a.force and jsonl.exists() and stamp.exists() and stamp.read_text() == command_text
    if reuse:
        try:
            plan, summary = read_run(jsonl)
            reuse = plan is not None and summary is not None
        except (OSError, ValueError):
            reuse = False
    if not reuse:
        jsonl.unlink(missing_ok=True)
        stamp.write_text(command_text)
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {command_text}", flush=True)
        log = runs_dir / f"{name}.log"
        try:
            with open(log, "w") as out:
                proc = subprocess.run(cmd + ["--log-jsonl", str(jsonl)], stdout=out, stderr=subprocess.STDOUT,
                                      timeout=a.timeout + 60, cwd=ROOT)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
        if status != 0:
            tail = "".join(log.read_text(errors="replace").splitlines(True)[-15:])
            print(f"  FAILED ({status}); last lines of {log}:\n{tail}", file=sys.stderr, flush=True)
            stamp.unlink(missing_ok=True)
            return dict(row, status=f"failed ({status})")
    try:
        plan, summary = read_run(jsonl)
    except (OSError, ValueError) as e:
        return dict(row, status=f"failed (unreadable results: {e})")
    if plan is None or summary is None:
        return dict(row, status=f"failed (no plan/summary record in {jsonl})")
    median = float(summary["median_step_s"])
    row.update(nodes=plan.get("nodes", 1), median_step_s=median, img_per_s=row["global_batch"] / median if median > 0 else 0.0,
               peak_mem_bytes=summary.get("peak_mem_bytes", ""), status="ok")
    for k in BREAKDOWN:
        row[f"{k}_s"] = summary.get("breakdown_s", {}).get(k, "")
    print(f"  {name}: median step {median:.4f} s, {row['img_per_s']:.1f} img/s", flush=True)
    return row


def median_run(reps):
    """The run with the median step time (its breakdown and memory come with it); failed if any failed."""
    failed = [r for r in reps if r["status"] != "ok"]
    if failed:
        return failed[0]
    ordered = sorted(reps, key=lambda r: r["median_step_s"])
    return dict(ordered[(len(ordered) - 1) // 2], repeats=len(reps))


def add_efficiency(rows):
    series = {}
    for r in rows:
        if r["status"] == "ok":
            series.setdefault((r["mode"], r["arch"], r["backend"]), []).append(r)
    for group in series.values():
        base = min(group, key=lambda r: r["ranks"])
        for r in group:
            ideal = base["img_per_s"] * r["ranks"] / base["ranks"]
            r["ideal_img_per_s"] = ideal
            r["efficiency"] = r["img_per_s"] / ideal if ideal > 0 else 0.0
    return series


def plot(series, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def label(key):
        return f"{key[1]} {key[2]} ({key[0]})"

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for key, group in sorted(series.items()):
        group = sorted(group, key=lambda r: r["ranks"])
        xs = [r["ranks"] for r in group]
        line, = ax.plot(xs, [r["img_per_s"] for r in group], "o-", label=label(key))
        ax.plot(xs, [r["ideal_img_per_s"] for r in group], "--", color=line.get_color(), alpha=0.5)
    ax.set(xlabel="ranks", ylabel="images/s", title="Throughput (dashed: ideal linear scaling)")
    ax.set_xticks(sorted({r["ranks"] for g in series.values() for r in g}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for key, group in sorted(series.items()):
        group = sorted(group, key=lambda r: r["ranks"])
        ax.plot([r["ranks"] for r in group], [100 * r["efficiency"] for r in group], "o-", label=label(key))
    ax.axhline(100, color="gray", ls="--", lw=1)
    ax.set(xlabel="ranks", ylabel="scaling efficiency (%)", title="Scaling efficiency")
    ax.set_xticks(sorted({r["ranks"] for g in series.values() for r in g}))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "efficiency.png", dpi=120)
    plt.close(fig)

    bars = [r for key in sorted(series) for r in sorted(series[key], key=lambda r: r["ranks"])]
    fig, ax = plt.subplots(figsize=(max(6.4, 0.55 * len(bars) + 2), 4.6))
    bottom = [0.0] * len(bars)
    for k in BREAKDOWN:
        vals = [float(r.get(f"{k}_s") or 0.0) for r in bars]
        ax.bar(range(len(bars)), vals, bottom=bottom, label=k.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([f"{r['arch']}\n{r['backend']} {r['mode']}\nnp{r['ranks']}" for r in bars], fontsize=7)
    ax.set(ylabel="seconds per step (mean)", title="Step time breakdown")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "breakdown.png", dpi=120)
    plt.close(fig)


def model_check(a, rows):
    """allreduce_bench per world size, then scaling_model.py selfcheck on the first weak series."""
    weak = [r for r in rows if r["mode"] == "weak" and r["status"] == "ok"]
    if not weak:
        print("model check: needs a weak-scaling series", file=sys.stderr)
        return 1
    first = (weak[0]["arch"], weak[0]["backend"])
    series = {r["ranks"]: r for r in weak if (r["arch"], r["backend"]) == first}
    args = []
    status = 0
    for n in sorted(series):
        args += ["--run", f"{n}={series[n]['jsonl']}"]
        if n < 2:
            continue
        bench = a.out / f"allreduce_np{n}.json"
        backend = first[1] if first[1] in ("ring", "hierarchical", "mpi", "nccl") else "ring"
        cmd = launcher(a, n) + [str(a.build / "allreduce_bench"), "--backend", backend, "--min-bytes", "8",
                                "--max-bytes", "64M", "--iters", "10", "--json", str(bench)]
        print(f"[{time.strftime('%H:%M:%S')}] {shlex.join(cmd)}", flush=True)
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(f"  allreduce_bench at {n} ranks failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            status = 1
            continue
        args += ["--bench", f"{n}={bench}"]
    report = a.out / "model_check.md"
    cmd = [sys.executable, str(ROOT / "scripts" / "scaling_model.py"), "selfcheck", *args, "--backend",
           first[1] if first[1] in ("ring", "hierarchical", "mpi", "nccl") else "ring", "--markdown"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    report.write_text(proc.stdout)
    print(proc.stdout, end="")
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr, end="")
        status = 1
    return status


def main(argv):
    a = parse_args(argv)
    runs_dir = a.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    modes = ["weak", "strong"] if a.mode == "both" else [a.mode]
    configs = [(mode, arch, backend, n) for mode in modes for arch in a.arch for backend in a.backend for n in a.ranks]
    runs = {c: [] for c in configs}
    for rep in range(a.repeats):  # interleaved, so a slow spell of a shared machine hits every configuration
        for c in configs:
            runs[c].append(run_one(a, *c, runs_dir, rep))
    rows = [median_run(runs[c]) for c in configs]
    series = add_efficiency(rows)
    with open(a.out / "scaling.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    print(f"\n{'mode':6} {'arch':9} {'backend':7} {'ranks':>5} {'step_s':>8} {'img/s':>9} {'eff':>6}  status")
    for r in rows:
        if r["status"] == "ok":
            print(f"{r['mode']:6} {r['arch']:9} {r['backend']:7} {r['ranks']:5d} {r['median_step_s']:8.4f} "
                  f"{r['img_per_s']:9.1f} {100 * r['efficiency']:5.1f}%  ok")
        else:
            print(f"{r['mode']:6} {r['arch']:9} {r['backend']:7} {r['ranks']:5d} {'':8} {'':9} {'':6}  {r['status']}")
    print(f"wrote {a.out / 'scaling.csv'}")
    if series and not a.no_plots:
        plot(series, a.out)
        print(f"wrote {a.out / 'throughput.png'}, {a.out / 'efficiency.png'}, {a.out / 'breakdown.png'}")
    failed = sum(r["status"] != "ok" for r in rows)
    status = 0
    if a.allreduce_bench:
        status = model_check(a, rows)
    if failed:
        print(f"{failed} of {len(rows)} runs failed (see {runs_dir}/*.log)", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
