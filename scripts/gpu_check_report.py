"""Part of scripts/gpu_check.sh: turns what the check gathered into RESULTS_DIR/gpu_check.json and prints
the summary table. Reads the facts file ("dotted.key<TAB>JSON" lines), the gtest JSON reports
(WORK/gtest_LABEL*.json, one per rank under mpirun), train_resnet's JSONL logs (RESULTS_DIR/train_ARCH.jsonl)
and the PyTorch peer's JSON (RESULTS_DIR/peer_ARCH.json). img_per_s is batch / median step for both, and
img_per_s_wall all images / the whole run's time (first steps, cuDNN's algorithm search included).
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
for label, t in tests.items():
    print("tests %-22s %3d passed, %d failed%s, %d skipped%s" % (label, t["passed"], len(t["failed"]),
          (" (" + ", ".join(t["failed"]) + ")") if t["failed"] else "", len(t["skipped"]),
          (" (" + ", ".join(t["skipped"]) + ")") if t["skipped"] else ""))
print("wrote", os.path.join(results, "gpu_check.json"))
found_here = failed[len(out_failed_before):]
if found_here:
    sys.exit("gpu_check: " + "; ".join(found_here))
