#!/usr/bin/env bash
# tests/apps/profile.sh BUILD_DIR WORK: --profile on the CPU, as a user runs it. train_resnet prints the
# per-family table and writes the JSONL profile record, whose families cover at least 90% of the measured
# step, with no host waits (a CPU run makes none); bench_step --profile prints the same table after its
# own timed steps and appends the record to --profile-jsonl; a run too short for the window says so.
set -euo pipefail
build=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "profile: FAILED: $*" >&2; exit 1; }

timeout 300 "$build/train_resnet" --synthetic -a resnet20 -b 32 --image-size 32 --threads 1 --steps 8 --log-every 4 \
  --profile --profile-steps 4 --log-jsonl "$work/run.jsonl" > "$work/run.log" 2>&1 || { cat "$work/run.log"; fail "train_resnet --profile"; }
grep -q "^profile (cpu, 4 steady step(s), host clocks)" "$work/run.log" || { cat "$work/run.log"; fail "no table"; }
for family in conv_fwd conv_dgrad conv_wgrad bn_fwd bn_bwd loss optimizer data; do
  grep -qE "^  $family +[0-9]" "$work/run.log" || { cat "$work/run.log"; fail "no $family row"; }
done
python3 - "$work/run.jsonl" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
profiles = [r for r in records if r.get("type") == "profile"]
assert len(profiles) == 1, f"expected one profile record, got {len(profiles)}"
p = profiles[0]
assert p["steps"] == 4 and p["device"] == "cpu", p
share = sum(f["share"] for f in p["families"])
assert abs(share - p["covered_share"]) < 1e-9, (share, p["covered_share"])
assert p["covered_share"] >= 0.90, f"the families cover only {p['covered_share']:.1%} of the step: {p}"
assert p["covered_share"] <= 1.02, f"the families add up to more than the step ({p['covered_share']:.1%}): counted twice?"
assert p["syncs_per_step"] == 0, p
for f in p["families"]:
    assert set(f) == {"family", "calls", "device_ms", "host_ms", "share"}, f
    assert f["calls"] > 0 and f["host_ms"] >= 0 and f["device_ms"] == 0, f
print(f"profile record: {len(p['families'])} families cover {p['covered_share']:.1%} of a {p['step_ms']:.1f} ms step")
PY

timeout 300 "$build/bench_step" -a resnet20 -b 8 --hw 16 --threads 2 --steps 2 --warmup 1 --profile --profile-steps 2 \
  --profile-jsonl "$work/bench.jsonl" > "$work/bench.log" 2>&1 || { cat "$work/bench.log"; fail "bench_step --profile"; }
grep -q "median_step_s=" "$work/bench.log" && grep -q "^profile (cpu, 2 steady step(s)" "$work/bench.log" ||
  { cat "$work/bench.log"; fail "bench_step: no timing line or no table"; }
grep -q '"type":"profile"' "$work/bench.jsonl" || fail "bench_step: no record in --profile-jsonl"

# --profile-layers: rows per (layer, family) under the modules' dotted paths, all of them in the record.
timeout 300 "$build/train_resnet" --synthetic -a resnet20 -b 8 --image-size 16 --threads 2 --steps 5 --profile-layers \
  --profile-steps 2 --log-jsonl "$work/layers.jsonl" > "$work/layers.log" 2>&1 || { cat "$work/layers.log"; fail "--profile-layers"; }
grep -qE "^  layer[1-3][.][0-2][.](conv|bn)[12] " "$work/layers.log" || { cat "$work/layers.log"; fail "no per-layer rows"; }
python3 - "$work/layers.jsonl" <<'PY'
import json, sys
p = [json.loads(l) for l in open(sys.argv[1]) if '"profile"' in l][0]
layers = {(r["layer"], r["family"]) for r in p["layers"]}
for want in [("conv1", "conv_fwd"), ("bn1", "bn_fwd"), ("layer1.0.conv1", "conv_fwd"), ("layer3.2.bn2", "bn_bwd"), ("layer3.2.conv2", "conv_wgrad"), ("fc", "gemm"), ("(none)", "loss")]:
    assert want in layers, f"no {want} row in {sorted(layers)}"
total = sum(r["host_ms"] for r in p["layers"]), sum(f["host_ms"] for f in p["families"])
assert abs(total[0] - total[1]) < 1e-6 * max(1, total[1]), total
PY

# Shorter than warm-up + window: no table, and the run says why.
timeout 300 "$build/train_resnet" --synthetic -a resnet20 -b 4 --image-size 8 --threads 1 --steps 2 --profile \
  > "$work/short.log" 2>&1 || { cat "$work/short.log"; fail "short run"; }
grep -q "profile: the run ended before" "$work/short.log" || { cat "$work/short.log"; fail "short run: no notice"; }
echo "profile ok"
