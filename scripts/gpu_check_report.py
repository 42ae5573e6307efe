"""Part of scripts/gpu_check.sh: turns what the check gathered into RESULTS_DIR/gpu_check.json and prints
the summary table. Reads the facts file ("dotted.key<TAB>JSON" lines), the gtest JSON reports
(WORK/gtest_LABEL*.json, one per rank under mpirun), train_resnet's JSONL logs (RESULTS_DIR/train_ARCH.jsonl)
and the PyTorch peer's JSON (RESULTS_DIR/peer_ARCH.json). img_per_s is batch / median step for both, and
img_per_s_wall all images / the whole run's time (first steps, cuDNN's algorithm search included).
Where the GPU time goes, side by side: train_resnet's profile record (type "profile" in train_resnet50.jsonl)
and the peer's (peer_profile_resnet50_bf16.json, torch.profiler's kernels by the same families) as
"profile_resnet50_bf16". fp16 and fp32 (TF32 on): bench_step's line (WORK/bench_resnet50_P.txt) and profile
record (bench_resnet50_P.jsonl) beside the peer's (peer_resnet50_P.json) as "precisions_resnet50". CUDA
graphs: bench_step's bf16 lines op by op and with --cuda-graph (WORK/bench_A_bf16_graph_off|on.txt) as
"cuda_graph_bf16". Any of these files may be missing (a dry run has none): what is there is reported.
  python3 scripts/gpu_check_report.py FACTS WORK RESULTS_DIR MODE [TEST_LABEL...]
Exit status 1 when it finds a failure the shell could not see: a GPU test skipped for want of a device in
a full run (the check did not check), or a GPU training summary without its GPU figures."""
import glob, json, os, sys

facts, work, results, mode, labels = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
out, failed = {}, []
for line in open(facts, newline="\n"):  # only \n ends a fact
    key, value = line.rstrip("\n").split("\t", 1)
    value = json.loads(value, strict=False)  # a tool's output may hold control characters
    if key.startswith("failed."):
        failed.append(value)
        continue
    node = out
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
out["failed"] = failed  # the same list: what this script finds is appended below
out_failed_before = list(failed)

# The commands, in the order they ran (or would run).
log = os.path.join(results, "gpu_check.log")
if os.path.exists(log):
    out["commands"] = [l[2:].rstrip() for l in open(log, errors="replace") if l.startswith("+ ")]

# Tests: per program, from gtest's JSON reports (one per rank under mpirun).
tests = {}
for label in labels:
    reports = sorted(glob.glob(os.path.join(work, "gtest_%s*.json" % label)))
    entry = {"passed": 0, "failed": [], "skipped": []}
    if not reports:
        entry["failed"].append("no report (the program did not start or crashed)")
    for r in reports:
        try:
            data = json.load(open(r))
        except ValueError as e:
            entry["failed"].append("%s: unreadable report (%s)" % (os.path.basename(r), e))
            continue
        for suite in data.get("testsuites", []):
            for t in suite.get("testsuite", []):
                name = "%s.%s" % (suite["name"], t["name"])
                if t.get("failures"):
                    entry["failed"].append(name)
                elif t.get("result") == "SKIPPED":
                    entry["skipped"].append(name)
                else:
                    entry["passed"] += 1
    entry["skipped"] = sorted(set(entry["skipped"]))
    entry["failed"] = sorted(set(entry["failed"]))
    tests[label] = entry
if tests:
    out["tests"] = tests
    tests_log = os.path.join(results, "tests.log")
    no_device = [l.strip() for l in open(tests_log, errors="replace") if "no CUDA device" in l] if os.path.exists(tests_log) else []
    if mode == "full" and no_device:
        failed.append("GPU tests skipped for want of a device: " + no_device[0])

# Training: ringtrain's summary records and the peer's, side by side.
def summary(path):
    """train_resnet's summary record, with the images per optimizer step from its plan record."""
    try:
        records = [json.loads(l) for l in open(path) if l.strip()]
    except (OSError, ValueError):
        return None
    s = [r for r in records if r.get("type") == "summary"]
    plans = [r for r in records if r.get("type") == "plan"]
    if not s:
        return None
    s = dict(s[-1])
    s["global_batch"] = plans[0].get("global_batch") if plans else None
    return s


runs = {}
for arch in ("resnet50", "resnet18"):
    mine = summary(os.path.join(results, "train_%s.jsonl" % arch))
    peer = None
    try:
        peer = json.load(open(os.path.join(results, "peer_%s.json" % arch)))
    except (OSError, ValueError):
        pass
    if mine is None and peer is None:
        continue
    run = {}
    if mine and mode == "full":
        lacking = [k for k in ("peak_gpu_mem_bytes", "cudnn_conv_algorithms") if not mine.get(k)]
        if lacking or mine.get("device", "").split(":")[0] != "cuda":
            failed.append("train_resnet %s: the summary lacks %s or ran on %s" % (arch, ", ".join(lacking) or "nothing", mine.get("device")))
    if mine:
        # The same two measures as the peer's: batch / median step, and all images / the whole run.
        run["ringtrain"] = {k: mine.get(k) for k in ("median_step_s", "peak_gpu_mem_bytes", "steps", "train_loss", "elapsed_s")}
        batch = mine.get("global_batch")
        run["ringtrain"]["img_per_s"] = batch / mine["median_step_s"] if batch and mine.get("median_step_s") else None
        run["ringtrain"]["img_per_s_wall"] = mine.get("img_per_s")
        if arch == "resnet50":
            out["cudnn_conv_algorithms_resnet50"] = mine.get("cudnn_conv_algorithms", [])
    if peer:
        run["pytorch"] = {k: peer.get(k) for k in ("median_step_s", "img_per_s", "img_per_s_wall", "peak_gpu_mem_bytes", "steps", "last_loss", "elapsed_s")}
    if mine and peer and mine.get("median_step_s") and peer.get("median_step_s"):
        run["speed_ratio_median_step"] = peer["median_step_s"] / mine["median_step_s"]  # > 1: ringtrain faster
        if mine.get("img_per_s") and peer.get("img_per_s_wall"):
            run["speed_ratio_wall"] = mine["img_per_s"] / peer["img_per_s_wall"]
        if mine.get("peak_gpu_mem_bytes") and peer.get("peak_gpu_mem_bytes"):
            run["memory_ratio"] = mine["peak_gpu_mem_bytes"] / peer["peak_gpu_mem_bytes"]  # < 1: ringtrain smaller
    runs[arch] = run
if runs:
    out["training"] = runs
    goal = runs.get("resnet50", {})
    if "ringtrain" in goal:
        out["goals"] = {"resnet50_bf16_img_per_s_at_least_6000": (goal["ringtrain"].get("img_per_s") or 0) >= 6000,
                        "resnet50_bf16_at_least_1.15x_pytorch": (goal.get("speed_ratio_median_step") or 0) >= 1.15}


def records(path, kind):
    """The JSONL file's records of one type ([] when the file is missing; unreadable lines are left out)."""
    found = []
    try:
        with open(path, errors="replace") as f:
            for l in f:
                try:
                    r = json.loads(l)
                except ValueError:
                    continue  # a line cut short when the program was stopped
                if isinstance(r, dict) and r.get("type") == kind:
                    found.append(r)
    except OSError:
        pass
    return found


def load_json(path):
    try:
        with open(path) as f:
            r = json.load(f)
        return r if isinstance(r, dict) else None
    except (OSError, ValueError):
        return None


def family_ms(record):
    """{family: (GPU ms a step, calls a step)} of a profile record."""
    return {f["family"]: (f.get("device_ms"), f.get("calls")) for f in (record or {}).get("families", [])
            if isinstance(f, dict) and f.get("family")}


# Where the GPU time goes: ringtrain's --profile table beside PyTorch's kernels by the same families.
mine_profile = (records(os.path.join(results, "train_resnet50.jsonl"), "profile") or [None])[-1]
peer_profile = load_json(os.path.join(results, "peer_profile_resnet50_bf16.json"))
if mine_profile or peer_profile:
    rf, pf = family_ms(mine_profile), family_ms(peer_profile)
    order = sorted(set(rf) | set(pf), key=lambda f: -max(rf.get(f, (0, 0))[0] or 0, pf.get(f, (0, 0))[0] or 0))
    out["profile_resnet50_bf16"] = {
        "ringtrain_step_ms": (mine_profile or {}).get("step_ms"),
        "ringtrain_median_step_ms": (mine_profile or {}).get("median_step_ms"),
        "ringtrain_covered_share": (mine_profile or {}).get("covered_share"),
        "ringtrain_syncs_per_step": (mine_profile or {}).get("syncs_per_step"),
        "pytorch_step_ms": (peer_profile or {}).get("step_ms"),
        "pytorch_median_step_ms": (peer_profile or {}).get("median_step_ms"),
        "pytorch_kernel_ms": (peer_profile or {}).get("kernel_ms"),
        "pytorch_covered_share": (peer_profile or {}).get("covered_share"),
        "steps": {"ringtrain": (mine_profile or {}).get("steps"), "pytorch": (peer_profile or {}).get("steps")},
        "families": {f: {"ringtrain_ms": rf.get(f, (None, None))[0], "pytorch_ms": pf.get(f, (None, None))[0],
                         "ringtrain_calls": rf.get(f, (None, None))[1], "pytorch_calls": pf.get(f, (None, None))[1]}
                     for f in order},
    }

def bench_line(path):
    """bench_step's result line in a tee'd output as {key: value} ({} when the file or the line is missing)."""
    try:
        with open(path, errors="replace") as f:
            line = next((l.strip() for l in f if l.startswith("ringtrain ") and "median_step_s=" in l), None)
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv) if line else {}


# fp16 and fp32 (TF32 on): bench_step's median step and profile beside the peer's.
precisions = {}
for precision in ("fp16", "fp32"):
    bench = {}
    fields = bench_line(os.path.join(work, "bench_resnet50_%s.txt" % precision))
    if fields:
        for key in ("median_step_s", "img_per_s"):
            try:
                bench[key] = float(fields[key])
            except (KeyError, ValueError):
                pass
        bench["tf32"] = fields.get("tf32")
        bench["loss_scaling"] = fields.get("loss_scaling")  # "dynamic" for fp16 since bench_step scales its loss
    prof = (records(os.path.join(results, "bench_resnet50_%s.jsonl" % precision), "profile") or [None])[-1]
    if prof:
        bench["profile_step_ms"] = prof.get("step_ms")
        bench["profile_median_step_ms"] = prof.get("median_step_ms")
        bench["profile_families_ms"] = {f: ms for f, (ms, _) in family_ms(prof).items()}
    peer = load_json(os.path.join(results, "peer_resnet50_%s.json" % precision))
    if not bench and not peer:
        continue
    entry = {}
    if bench:
        entry["ringtrain"] = bench
    if peer:
        entry["pytorch"] = {k: peer.get(k) for k in ("median_step_s", "img_per_s", "img_per_s_wall", "peak_gpu_mem_bytes",
                                                     "steps", "tf32", "loss_scaling", "last_loss")}
    if bench.get("median_step_s") and peer and peer.get("median_step_s"):
        entry["speed_ratio_median_step"] = peer["median_step_s"] / bench["median_step_s"]  # > 1: ringtrain faster
    precisions[precision] = entry
if precisions:
    out["precisions_resnet50"] = precisions

# CUDA graphs: bench_step's bf16 median step op by op and replayed (WORK/bench_A_bf16_graph_off|on.txt).
graphs = {}
for arch in ("resnet50", "resnet18"):
    off = bench_line(os.path.join(work, "bench_%s_bf16_graph_off.txt" % arch))
    on = bench_line(os.path.join(work, "bench_%s_bf16_graph_on.txt" % arch))
    if not off and not on:
        continue
    entry = {"cuda_graph": on.get("cuda_graph")}
    for name, fields in (("op_by_op_median_step_s", off), ("graph_median_step_s", on)):
        try:
            entry[name] = float(fields["median_step_s"])
        except (KeyError, ValueError):
            entry[name] = None
    if entry["op_by_op_median_step_s"] and entry["graph_median_step_s"] and entry["cuda_graph"] == "on":
        entry["speedup"] = entry["op_by_op_median_step_s"] / entry["graph_median_step_s"]  # > 1: the graph is faster
    graphs[arch] = entry
if graphs:
    out["cuda_graph_bf16"] = graphs

with open(os.path.join(results, "gpu_check.json"), "w") as f:
    json.dump(out, f, indent=1)
def fmt(v, digits):
    return "-" if v is None else "%.*f" % (digits, v)

for arch, run in runs.items():
    r, p = run.get("ringtrain", {}), run.get("pytorch", {})
    print("%-9s ringtrain %s img/s (median step %s s, peak GPU %s GiB) | PyTorch %s img/s (median step %s s, peak GPU %s GiB) | ratio %s"
          % (arch, fmt(r.get("img_per_s"), 0),
             fmt(r.get("median_step_s"), 4), fmt((r.get("peak_gpu_mem_bytes") or 0) / 2**30, 2),
             fmt(p.get("img_per_s"), 0), fmt(p.get("median_step_s"), 4), fmt((p.get("peak_gpu_mem_bytes") or 0) / 2**30, 2),
             fmt(run.get("speed_ratio_median_step"), 3)))
for precision, entry in precisions.items():
    r, p = entry.get("ringtrain", {}), entry.get("pytorch", {})
    print("resnet50 %s ringtrain %s img/s (median step %s s, profiled step %s ms) | PyTorch %s img/s (median step %s s) | ratio %s"
          % (precision, fmt(r.get("img_per_s"), 0), fmt(r.get("median_step_s"), 4), fmt(r.get("profile_step_ms"), 1),
             fmt(p.get("img_per_s"), 0), fmt(p.get("median_step_s"), 4), fmt(entry.get("speed_ratio_median_step"), 3)))
for arch, g in graphs.items():
    print("%s bf16 CUDA graph %s: median step %s s op by op, %s s replayed | speedup %s"
          % (arch, g.get("cuda_graph") or "-", fmt(g.get("op_by_op_median_step_s"), 4), fmt(g.get("graph_median_step_s"), 4),
             fmt(g.get("speedup"), 3)))
if "profile_resnet50_bf16" in out:
    prof = out["profile_resnet50_bf16"]
    print("resnet50 bf16, GPU ms a step by family: ringtrain (--profile, step %s ms) | PyTorch (torch.profiler, step %s ms)"
          % (fmt(prof["ringtrain_step_ms"], 1), fmt(prof["pytorch_step_ms"], 1)))
    print("  %-12s %10s %10s %8s" % ("family", "ringtrain", "PyTorch", "r/p"))
    totals = [None, None]  # None: that side has no profile
    for fam, v in prof["families"].items():
        r, p = v["ringtrain_ms"], v["pytorch_ms"]
        if r is not None:
            totals[0] = (totals[0] or 0) + r
        if p is not None:
            totals[1] = (totals[1] or 0) + p
        print("  %-12s %10s %10s %8s" % (fam, fmt(r, 2), fmt(p, 2), fmt(r / p if r is not None and p else None, 2)))
    print("  %-12s %10s %10s %8s" % ("all", fmt(totals[0], 2), fmt(totals[1], 2),
                                     fmt(totals[0] / totals[1] if totals[0] is not None and totals[1] else None, 2)))
for label, t in tests.items():
    print("tests %-22s %3d passed, %d failed%s, %d skipped%s" % (label, t["passed"], len(t["failed"]),
          (" (" + ", ".join(t["failed"]) + ")") if t["failed"] else "", len(t["skipped"]),
          (" (" + ", ".join(t["skipped"]) + ")") if t["skipped"] else ""))
print("wrote", os.path.join(results, "gpu_check.json"))
found_here = failed[len(out_failed_before):]
if found_here:
    sys.exit("gpu_check: " + "; ".join(found_here))
