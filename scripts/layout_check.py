#!/usr/bin/python3
"""Checks --layout auto against measurement: runs the planner, then every layout it considered, by hand.

  scripts/layout_check.py --build build --launcher "mpirun -np 2 --oversubscribe" [--markdown] \
      [--json OUT] -- --synthetic -a resnet56 --global-batch 128 --steps 12 --device cpu

The arguments after -- are train_resnet's (the run's other flags: model, data, global batch, steps). The
first run adds --layout auto and reads the plan record's "layout": every layout considered with its flags,
predicted step and peak. Then each is run with its flags instead of --layout auto, and its summary gives the
measured median step and peak (the largest rank's); with --repeats N (default 2) every layout runs N times,
in rounds, and the fastest median and the median peak count (interference on a shared machine only slows
a run). The table has, per layout, predicted and measured step
and peak with their errors; below it the verdicts of issue 50:
  * the chosen layout's measured step is within 5% of the best measured one,
  * predicted steps within 15% of the measured (median error within 10%),
  * predicted peaks within 10%.
With several rounds, a last line gives the measurement's own spread: how far one layout's runs moved
between rounds (the slowest over the fastest median), the largest and the median over the layouts. A
prediction cannot be checked tighter than the runs it is checked against repeat.
--launcher is the command before the program: "mpirun -np 4 --oversubscribe", or
"bash scripts/cluster.sh run -np 4 --" on the emulated cluster. Each run is under `timeout` (--timeout).
Exit status: 0 every verdict holds, 1 one does not, 2 a run failed or bad arguments.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile


def run(launcher, program, args, log, timeout):
    cmd = ["timeout", str(timeout)] + launcher + [program] + args + ["--log-jsonl", log]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:])
        raise SystemExit(f"layout_check: exit {p.returncode}: {shlex.join(cmd)}")
    records = [json.loads(line) for line in open(log) if line.strip()]
    return p.stdout, records


def by_hand(args):
    """The run's arguments without those a layout's flags replace (--global-batch, -b/--batch-size) and without
    --max-memory, which pipelines refuse: the measured peaks are checked against the budget here instead."""
    out, skip = [], False
    for x in args:
        if skip:
            skip = False
            continue
        if x in ("--global-batch", "-b", "--batch-size", "--max-memory"):
            skip = True
            continue
        if x.startswith("--global-batch=") or x.startswith("--batch-size=") or x.startswith("--max-memory="):
            continue
        out.append(x)
    return out


def last(records, kind):
    found = [r for r in records if r.get("type") == kind]
    if not found:
        raise SystemExit(f"layout_check: no '{kind}' record in the run's log")
    return found[-1]


def rounds_spread(ran):
    """How far each layout's runs moved between rounds: its slowest median step over its fastest, less 1; the
    largest (and whose) and the median over the layouts run more than once. None when none was."""
    moves = [(max(r["steps"]) / min(r["steps"]) - 1, r["layout"]) for r in ran if len(r["steps"]) > 1]
    if not moves:
        return None
    largest = max(moves)
    return {"largest": largest[0], "largest_layout": largest[1], "median": statistics.median(m for m, _ in moves),
            "layouts": len(moves)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="the build folder holding train_resnet")
    ap.add_argument("--launcher", default="mpirun -np 2 --oversubscribe")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a run may take")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", help="write the table here")
    ap.add_argument("--title", default="", help="a line above the table")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each layout (the fastest median counts)")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    program = os.path.join(a.build, "train_resnet")
    if not os.access(program, os.X_OK):
        ap.error(f"{program} is not built")
    launcher = shlex.split(a.launcher)
    tmp = tempfile.mkdtemp(prefix="layout_check.")
    out, records = run(launcher, program, args + ["--layout", "auto"], os.path.join(tmp, "auto.jsonl"), a.timeout)
    plan = last(records, "plan")
    if "layout" not in plan:
        raise SystemExit("layout_check: the plan record has no 'layout' (was --layout auto taken?)")
    layout = plan["layout"]
    auto_summary = last(records, "summary")
    rows = []
    chosen_flags = layout["chosen"]["flags"]
    for c in layout["considered"]:
        pred = c["predicted"]
        rows.append({"layout": c["flags"], "fits": pred["fits"], "chosen": c["flags"] == chosen_flags,
                     "pred_step": pred["step_s"], "pred_peak": pred["peak_bytes"], "steps": [], "peaks": []})
    # Rounds over every layout (interference on a shared machine only slows a run): each layout's step is
    # the fastest of its runs' medians, its peak their median.
    for rep in range(a.repeats):
        for i, r in enumerate(rows):
            if not r["fits"]:
                continue
            _, rec = run(launcher, program, by_hand(args) + shlex.split(r["layout"]),
                         os.path.join(tmp, f"l{i}.{rep}.jsonl"), a.timeout)
            s = last(rec, "summary")
            r["steps"].append(s["median_step_s"])
            r["peaks"].append(s["peak_mem_bytes"])
            sys.stderr.write(f"  round {rep + 1}, {i + 1}/{len(rows)} {r['layout']}: {1e3 * s['median_step_s']:.1f} ms\n")
    for r in rows:
        if r["fits"]:
            r["step"], r["peak"] = min(r["steps"]), statistics.median(r["peaks"])
    ran = [r for r in rows if r["fits"]]
    for r in ran:
        r["step_err"] = r["pred_step"] / r["step"] - 1
        r["peak_err"] = r["pred_peak"] / r["peak"] - 1
    budget = layout.get("budget_bytes") if layout.get("budget_source") == "--max-memory" else None
    if budget:  # the fastest measured among the layouts whose measured peak the budget holds
        ran_fit = [r for r in ran if r["peak"] <= budget]
        best = min(ran_fit or ran, key=lambda r: r["step"])
    else:
        best = min(ran, key=lambda r: r["step"])
    chosen = next(r for r in ran if r.get("chosen"))
    med = statistics.median(abs(r["step_err"]) for r in ran)
    verdicts = [] if not budget else [
        (f"--max-memory {budget / 2**20:.0f} MiB: the chosen layout's measured peak {chosen['peak'] / 2**20:.0f} MiB "
         f"is within it, and {sum(1 for r in ran if r['peak'] <= budget)} of the {len(ran)} layouts run fit it "
         f"measured", chosen["peak"] <= budget)]
    verdicts += [
        (f"chosen measured {1e3 * chosen['step']:.1f} ms, best measured{' of those that fit' if budget else ''} "
         f"{1e3 * best['step']:.1f} ms "
         f"({100 * (chosen['step'] / best['step'] - 1):+.1f}%, goal within 5%)", chosen["step"] <= 1.05 * best["step"]),
        (f"step errors: largest {100 * max(abs(r['step_err']) for r in ran):.1f}% (goal 15%), median "
         f"{100 * med:.1f}% (goal 10%)", max(abs(r["step_err"]) for r in ran) <= 0.15 and med <= 0.10),
        (f"peak errors: largest {100 * max(abs(r['peak_err']) for r in ran):.1f}% (goal 10%)",
         max(abs(r["peak_err"]) for r in ran) <= 0.10),
    ]
    lines = []
    if a.title:
        lines.append(a.title)
    sep = " | " if a.markdown else "  "
    head = ["layout (flags)", "pred ms", "meas ms", "err", "pred peak MiB", "meas peak MiB", "err"]
    lines.append(("| " if a.markdown else "") + sep.join(head) + (" |" if a.markdown else ""))
    if a.markdown:
        lines.append("|" + "|".join(["---"] * len(head)) + "|")
    for r in rows:
        mark = " (chosen)" if r.get("chosen") else ""
        if budget and r["fits"] and r["peak"] > budget:
            mark += " (measured over the budget)"
        if not r["fits"]:
            cells = [r["layout"] + " (predicted not to fit: not run)", f"{1e3 * r['pred_step']:.1f}", "-", "-",
                     f"{r['pred_peak'] / 2**20:.0f}", "-", "-"]
        else:
            cells = [f"`{r['layout']}`{mark}" if a.markdown else r["layout"] + mark, f"{1e3 * r['pred_step']:.1f}",
                     f"{1e3 * r['step']:.1f}", f"{100 * r['step_err']:+.1f}%", f"{r['pred_peak'] / 2**20:.0f}",
                     f"{r['peak'] / 2**20:.0f}", f"{100 * r['peak_err']:+.1f}%"]
        lines.append(("| " if a.markdown else "") + sep.join(cells) + (" |" if a.markdown else ""))
    lines.append("")
    lines.append(f"planning took {layout.get('planning_s', 0):.2f} s; the auto run measured "
                 f"{1e3 * auto_summary['median_step_s']:.1f} ms a step")
    for text, ok in verdicts:
        lines.append(f"{'PASS' if ok else 'FAIL'}: {text}")
    spread = rounds_spread(ran)
    if spread:
        lines.append(f"measurement spread: one layout's rounds differed by up to {100 * spread['largest']:.1f}% "
                     f"({spread['largest_layout']}), median {100 * spread['median']:.1f}%, over "
                     f"{spread['layouts']} layouts run {a.repeats} times")
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": args, "launcher": a.launcher, "rows": rows, "link": layout.get("link"),
                       "world": layout.get("world"), "planning_s": layout.get("planning_s"), "spread": spread,
                       "verdicts": [{"text": t, "ok": ok} for t, ok in verdicts]}, f, indent=1)
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
