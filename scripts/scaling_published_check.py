#!/usr/bin/python3
"""Checks scaling_model.py's predictions against published scaling measurements (docs/scaling/published.csv).

    scaling_published_check.py [FILE.csv] [--markdown] [--json OUT] [--assert-band]

One row of FILE.csv is one published measurement and every input the model needs for it; the columns are
documented in docs/SCALING.md ("Checked against published clusters"). For each row it prints the published
figure, the prediction and the error in points:

  kind "efficiency": published = 100 * throughput(gpus) / (gpus * throughput(1 GPU)), in %;
  kind "bucket":     published = the throughput change in % when the bucket size goes from bucket_mb to
                     bucket_mb_to at the same GPUs (negative: the second is slower).

Rows carry a role: "check" (the rows the model was tuned to meet), "calibration" (neighbouring measurements a
generation's or a framework's parameter was set from, shown to say how well they are met), "held-out" (not
looked at while tuning). The summary gives, per role and kind, the mean absolute error and the worst row.
Rows of one `generation` must agree on the hardware's columns and rows of one `framework` on the framework's
(no parameter may be set for one row alone); a file where they differ is refused, naming the rows.

--assert-band [ROLES] exits 1 unless, for the rows of those roles (default "check"; "check,held-out" for both), the
efficiency rows' mean absolute error is at most 3 points and none is worse than 6, and every bucket row has the
published sign and is within 2 points.
"""
import argparse
import csv
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling_model as sm  # noqa: E402

PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "scaling_published_check.py"
DEFAULT_CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "scaling", "published.csv")

GENERATION_COLUMNS = ("gpus_per_node", "intra_gbps", "intra_alpha_us", "nics_per_node", "nic_gbit", "line_rate",
                      "inter_alpha_us", "contention")
FRAMEWORK_COLUMNS = ("tensor_cost_us", "bucket_cost_us", "start_delay_us", "algorithm")
NUMBERS = {  # column: (type, lowest, highest)
    "published": (float, -100, 100), "gpus": (int, 1, 1 << 20), "step_s": (float, 1e-6, 1e4),
    "backward_share": (float, 0.01, 1), "grad_bytes": (int, 1, 8), "bucket_mb": (float, 1e-6, 1e6),
    "tensor_cost_us": (float, 0, 1e6), "bucket_cost_us": (float, 0, 1e6), "start_delay_us": (float, 0, 1e7),
    "gpus_per_node": (int, 1, 1 << 16), "intra_gbps": (float, 1e-3, 1e5), "intra_alpha_us": (float, 0, 1e6),
    "nics_per_node": (int, 1, 1 << 10), "nic_gbit": (float, 1e-3, 1e6), "line_rate": (float, 0.01, 1),
    "inter_alpha_us": (float, 0, 1e6), "contention": (float, 0, 1),
}
REQUIRED = ("id", "role", "kind", "source", "setting", "published", "arch", "gpus", "step_s", "backward_share",
            "ready", "framework", "grad_bytes", "bucket_mb", "baseline", "generation") + GENERATION_COLUMNS \
    + FRAMEWORK_COLUMNS
ROLES = ("check", "calibration", "held-out")


def number(row, col, where):
    kind, lo, hi = NUMBERS[col]
    text = (row.get(col) or "").strip()
    try:
        v = kind(text)
    except ValueError:
        raise sm.InputError(f"{where}: column '{col}' must be {'an integer' if kind is int else 'a number'}, "
                            f"got '{text}'") from None
    if not (math.isfinite(v) and lo <= v <= hi):
        raise sm.InputError(f"{where}: column '{col}' must be from {lo:g} to {hi:g}, got {text}")
    return v


def parse_row(row, where):
    for col in REQUIRED:
        if not (row.get(col) or "").strip():
            raise sm.InputError(f"{where}: column '{col}' is empty")
    r = {c: (row.get(c) or "").strip() for c in row if c}
    for col in NUMBERS:
        r[col] = number(row, col, where)
    if r["role"] not in ROLES:
        raise sm.InputError(f"{where}: role '{r['role']}' (one of {', '.join(ROLES)})")
    if r["kind"] not in ("efficiency", "bucket"):
        raise sm.InputError(f"{where}: kind '{r['kind']}' (efficiency or bucket)")
    if r["kind"] == "bucket":
        if not r.get("bucket_mb_to"):
            raise sm.InputError(f"{where}: a bucket row needs 'bucket_mb_to'")
        r["bucket_mb_to"] = float(r["bucket_mb_to"])
    if r["ready"] not in ("flops", "bytes"):
        raise sm.InputError(f"{where}: ready '{r['ready']}' (flops or bytes)")
    if r["baseline"] not in ("single", "framework-1gpu"):
        raise sm.InputError(f"{where}: baseline '{r['baseline']}' (single or framework-1gpu)")
    if not (r["algorithm"] in sm.ALGORITHMS or r["algorithm"].startswith("nccl-")):
        raise sm.InputError(f"{where}: algorithm '{r['algorithm']}' (one of {', '.join(sm.ALGORITHMS)}, nccl-X.Y)")
    if r["algorithm"].startswith("nccl-") and r["algorithm"] != "nccl-ring":
        sm.nccl_choice(r["algorithm"][len("nccl-"):])
    r["where"] = where
    return r


def load(path):
    try:
        with open(path, newline="") as f:
            lines = [l for l in f if l.strip() and not l.lstrip().startswith("#")]
    except OSError as e:
        raise sm.InputError(f"{path}: cannot read ({e.strerror})") from None
    reader = csv.DictReader(lines)
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise sm.InputError(f"{path}: no column {', '.join(repr(c) for c in missing)}")
    rows = [parse_row(row, f"{path}: row '{row.get('id') or i}'") for i, row in enumerate(reader, 1)]
    if not rows:
        raise sm.InputError(f"{path}: no rows")
    ids = [r["id"] for r in rows]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise sm.InputError(f"{path}: row ids used twice: {', '.join(dup)}")
    for key, cols in (("generation", GENERATION_COLUMNS), ("framework", FRAMEWORK_COLUMNS)):
        first = {}
        for r in rows:
            f = first.setdefault(r[key], r)
            for c in cols:
                if r[c] != f[c]:
                    raise sm.InputError(f"{path}: rows '{f['id']}' and '{r['id']}' share {key} '{r[key]}' but not "
                                        f"'{c}' ({f[c]} vs {r[c]}): a {key}'s parameters are the same in every row")
    return rows


def setting_of(r, bucket_mb=None):
    cluster = sm.Cluster(r["gpus_per_node"], r["intra_gbps"], r["intra_alpha_us"], r["nics_per_node"], r["nic_gbit"],
                         r["line_rate"], r["inter_alpha_us"], r["algorithm"], r["contention"])
    framework = sm.Framework(bucket_mb or r["bucket_mb"], r["grad_bytes"], r["tensor_cost_us"], r["bucket_cost_us"],
                             r["start_delay_us"], r["baseline"])
    return cluster, framework


def predict_row(r):
    """(predicted figure, details) for one row."""
    tensors = sm.load_arch(r["arch"], r.get("sizes_file") or None)

    def one(bucket_mb=None):
        cluster, framework = setting_of(r, bucket_mb)
        buckets = sm.fill_buckets(tensors, framework, r["ready"])
        return sm.simulate_gpu_step(r["step_s"], r["backward_share"], buckets, r["gpus"], cluster, framework,
                                    len(tensors))

    try:
        base = one()
        if r["kind"] == "efficiency":
            return 100 * base["efficiency"], base
        other = one(r["bucket_mb_to"])
        return 100 * (base["step_s"] / other["step_s"] - 1), other
    except sm.InputError as e:
        raise sm.InputError(f"{r['where']}: {e}") from None


def check(rows):
    out = []
    for r in rows:
        pred, detail = predict_row(r)
        out.append({"id": r["id"], "role": r["role"], "kind": r["kind"], "setting": r["setting"],
                    "source": r["source"], "gpus": r["gpus"], "published": r["published"], "predicted": pred,
                    "error": pred - r["published"], "exposed_ms": 1e3 * detail["exposed_s"],
                    "contention_ms": 1e3 * detail["contention_s"], "fixed_ms": 1e3 * detail["fixed_s"],
                    "comm_total_ms": 1e3 * detail["comm_total_s"]})
    return out


def summary(results):
    groups = []
    for role in ROLES:
        for kind in ("efficiency", "bucket"):
            sel = [x for x in results if x["role"] == role and x["kind"] == kind]
            if not sel:
                continue
            worst = max(sel, key=lambda x: abs(x["error"]))
            groups.append({"role": role, "kind": kind, "rows": len(sel),
                           "mae": sum(abs(x["error"]) for x in sel) / len(sel), "worst": worst["id"],
                           "worst_error": worst["error"],
                           "wrong_sign": [x["id"] for x in sel if kind == "bucket"
                                          and x["published"] * x["predicted"] < 0]})
    return groups


def band_failures(results, roles=("check",)):
    fails = []
    for role in roles:
        eff = [x for x in results if x["role"] == role and x["kind"] == "efficiency"]
        if eff:
            mae = sum(abs(x["error"]) for x in eff) / len(eff)
            if mae > 3:
                fails.append(f"{role} rows: mean absolute error {mae:.2f} points > 3")
            fails += [f"{x['id']}: {x['error']:+.1f} points (more than 6)" for x in eff if abs(x["error"]) > 6]
        for x in results:
            if x["role"] == role and x["kind"] == "bucket":
                if x["published"] * x["predicted"] < 0:
                    fails.append(f"{x['id']}: predicted {x['predicted']:+.1f}% against {x['published']:+.1f}% "
                                 "(wrong sign)")
                elif abs(x["error"]) > 2:
                    fails.append(f"{x['id']}: {x['error']:+.1f} points (more than 2)")
    return fails


def main(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("csv", nargs="?", default=DEFAULT_CSV, help="published rows (default: docs/scaling/published.csv)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", help="write the rows and the summary here")
    p.add_argument("--assert-band", nargs="?", const="check", metavar="ROLES",
                   help="exit 1 unless the rows of these roles (default: check; e.g. check,held-out) are within the "
                        "band (see the description)")
    args = p.parse_args(argv)
    try:
        results = check(load(args.csv))
        md = args.markdown
        headers = ["row", "role", "setting", "GPUs", "published", "predicted", "error", "exposed", "contention",
                   "fixed"]
        cells = [[x["id"], x["role"], x["setting"], x["gpus"],
                  f"{x['published']:.1f}%", f"{x['predicted']:.1f}%", f"{x['error']:+.1f}",
                  f"{x['exposed_ms']:.1f} ms", f"{x['contention_ms']:.1f} ms", f"{x['fixed_ms']:.1f} ms"]
                 for x in results]
        print(sm.format_table(headers, cells, md))
        print()
        groups = summary(results)
        print(sm.format_table(["role", "kind", "rows", "mean abs error", "worst row", "its error", "wrong sign"],
                              [[g["role"], g["kind"], g["rows"], f"{g['mae']:.2f}", g["worst"],
                                f"{g['worst_error']:+.1f}", ", ".join(g["wrong_sign"]) or "-"] for g in groups], md))
        if args.json:
            sm.write_json(args.json, {"csv": args.csv, "rows": results, "summary": groups})
        if args.assert_band:
            roles = args.assert_band.split(",")
            bad = [r for r in roles if r not in ROLES]
            if bad:
                raise sm.InputError(f"--assert-band: no role {', '.join(bad)} (roles: {', '.join(ROLES)})")
            fails = band_failures(results, roles)
            for f in fails:
                print(f"{PROG}: outside the band: {f}", file=sys.stderr)
            if fails:
                return 1
    except sm.InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
