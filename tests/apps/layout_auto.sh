#!/usr/bin/env bash
# layout_auto.sh BUILD_DIR WORK_DIR: --layout auto (runtime/layout/) on 2 ranks. It prints the table, the choice
# and what planning cost; the plan record's "layout" holds every layout considered with its prediction; the run
# is bitwise the chosen layout given by hand (its flags in place of --global-batch and --layout auto); with a
# --max-memory that plain data parallelism exceeds it chooses a layout that fits, and that run is bitwise its
# flags by hand too; refusals name their reason (a global batch the world cannot split, nothing that fits,
# flags it chooses itself). ringtrain_plan answers for a world it does not run in, never superlinear.
set -euo pipefail
build=$(cd "$1" && pwd); work=$2
rm -rf "$work"; mkdir -p "$work"; cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "layout_auto test: FAIL: $*"; exit 1; }
"$build/make_shards" synthetic data --shape 32x32x3 --count 512 --classes 10 --shards 2 > /dev/null 2>&1
base=(--data data -a resnet20 --steps 3 --log-every 100 --threads 1 --seed 7)
common=("${base[@]}" --checkpoint-every 3)
run() { # run NAME ARGS...: 2 ranks, its output in NAME.log
  local name=$1; shift
  timeout -k 5 300 mpirun -np 2 --oversubscribe "$build/train_resnet" "${common[@]}" "$@" > "$name.log" 2>&1 ||
    { cat "$name.log"; fail "$name: $*"; }
}
refused() { # refused NAME PATTERN ARGS...: the run fails, naming PATTERN
  local name=$1 pattern=$2; shift 2
  if timeout -k 5 300 mpirun -np 2 --oversubscribe "$build/train_resnet" "${base[@]}" "$@" > "$name.log" 2>&1; then
    cat "$name.log"; fail "$name: ran, but should be refused"
  fi
  grep -q -- "$pattern" "$name.log" || { cat "$name.log"; fail "$name: the error does not say '$pattern'"; }
  ! grep -q "terminate called" "$name.log" || fail "$name: an exception escaped"
}
same() { "$build/tests/compare_checkpoints" "$1" "$2" > /dev/null || fail "$3: $1 and $2 differ"; }
# The layout's flags from a plan record: chosen, or the fitting layout with the smallest peak, or the peaks.
plan() {
  python3 - "$@" <<'PY'
import json, sys
log, what = sys.argv[1], sys.argv[2]
p = next(json.loads(l) for l in open(log) if '"type":"plan"' in l.replace(" ", ""))
lay = p["layout"]
if what == "chosen":
    print(lay["chosen"]["flags"])
elif what == "check":
    c = lay["considered"]
    assert len(c) >= 8, f"{len(c)} layouts considered, expected 8 or more"
    for x in c:
        pr = x["predicted"]
        assert pr["step_s"] > 0 and pr["peak_bytes"] > 0 and 0 <= pr["comm_share"] < 1, x
        assert x["replicas"] * x["stages"] == 2 and x["batch"] * x["accum"] * x["replicas"] == lay["global_batch"], x
    steps = [x["predicted"]["step_s"] for x in c if x["predicted"]["fits"]]
    assert lay["predicted"]["step_s"] == min(steps), "the chosen layout is not the fastest predicted"
    assert all("why_not" in x for x in c[1:]), "a layout that lost does not say why"
    assert lay["link"]["source"].startswith("measured at start-up"), lay["link"]
    assert lay["planning_s"] > 0 and len(lay["compute"]["blocks"]) > 2
    # The probes leave the run little: their kernels' plans dropped, the heap trimmed, the link probe's
    # messages no larger than the model's gradients (a 16 MiB one left 16 MiB). Not under AddressSanitizer,
    # whose heap keeps what is freed.
    if sys.argv[3] != "sanitized":
        assert lay["probe_leftover_bytes"] < 8 << 20, f"the probes left {lay['probe_leftover_bytes']} bytes"
    print("ok")
elif what == "budget":
    # A budget that plain data parallelism (no accumulation, ZeRO or recompute) exceeds and the smallest layout
    # fits. Where the layout chosen without a budget fits below plain with room to spare, the budget lies below
    # it too, so that the choice must change; where that choice is already (near) the smallest, as on an AMD
    # Zen 3 where accumulation with ZeRO won, the budget only excludes plain. fits() keeps 5% to spare and
    # counts what the probes left.
    c = lay["considered"]
    plain = next(x for x in c if x["stages"] == 1 and x["accum"] == 1 and x["zero"] == 0
                 and x["recompute"] == "off")["predicted"]["peak_bytes"]
    left = lay.get("probe_leftover_bytes", 0)
    low = (min(x["predicted"]["peak_bytes"] for x in c if x["stages"] == 1) + left) * 1.05
    chosen = lay["predicted"]["peak_bytes"]
    above = min(plain, chosen) if chosen > low * 1.2 else plain
    assert above > low * 1.1, f"no budget lies between the smallest peak ({low:.0f} with 5% and the probes' " \
        f"leftover) and plain's {plain}"
    print(int((above + low) / 2))
elif what == "tight":
    # The run under the budget: plain does not fit it, the choice does, and is the fastest predicted of those
    # that fit (predictions are the tight run's own: its probes ran again under the budget).
    budget = int(sys.argv[3])
    c = lay["considered"]
    plain = [x for x in c if x["stages"] == 1 and x["accum"] == 1 and x["zero"] == 0 and x["recompute"] == "off"]
    assert plain and not any(x["predicted"]["fits"] for x in plain), f"plain fits the budget {budget}: {plain}"
    assert lay["predicted"]["fits"], lay["predicted"]
    left = lay.get("probe_leftover_bytes", 0)
    assert (lay["predicted"]["peak_bytes"] + left) * 1.05 <= budget, (lay["predicted"], left, budget)
    steps = [x["predicted"]["step_s"] for x in c if x["predicted"]["fits"]]
    assert lay["predicted"]["step_s"] == min(steps), "the choice under the budget is not the fastest that fits"
    assert any(not x["predicted"]["fits"] and x.get("why_not", "").startswith("does not fit") for x in c), \
        "no layout says it does not fit"
    print("ok")
PY
}

# 1. --layout auto: the table, the choice, the cost; the plan record; bitwise the chosen flags by hand.
run auto --global-batch 128 --layout auto --checkpoint-dir auto --log-jsonl auto.jsonl
for line in "layout auto: .* layouts of global batch 128 over 2 rank(s) on 1 host(s)" "<- chosen" "layout auto: chose" \
            "planned in .* s (compute probe"; do
  grep -q -- "$line" auto.log || { cat auto.log; fail "the output has no '$line'"; }
done
sanitized=plain
grep -q "^RINGTRAIN_SANITIZE:BOOL=ON" "$build/CMakeCache.txt" 2>/dev/null && sanitized=sanitized
[[ $(plan auto.jsonl check "$sanitized") == ok ]] || fail "the plan record's layout"
chosen=$(plan auto.jsonl chosen)
# shellcheck disable=SC2086
run hand $chosen --checkpoint-dir hand
same auto/ckpt-step00000003.h5 hand/ckpt-step00000003.h5 "--layout auto against its flags by hand ($chosen)"
echo "--layout auto chose '$chosen' and trains bitwise like it given by hand"

# 2. A budget plain data parallelism exceeds: the choice fits it, and trains bitwise like its flags.
budget=$(plan auto.jsonl budget) || fail "no budget separates the layouts"
run tight --global-batch 128 --layout auto --max-memory "$budget" --checkpoint-dir tight --log-jsonl tight.jsonl
tight=$(plan tight.jsonl chosen)
check=$(plan tight.jsonl tight "$budget") || { cat tight.log; fail "under --max-memory $budget: $check"; }
[[ $check == ok ]] || fail "under --max-memory $budget it chose '$tight'"
# shellcheck disable=SC2086
run tight-hand $tight --max-memory "$budget" --checkpoint-dir tight-hand
same tight/ckpt-step00000003.h5 tight-hand/ckpt-step00000003.h5 "under a budget, --layout auto against '$tight'"
echo "under --max-memory $budget (plain does not fit) it chose '$tight', bitwise the same by hand"

# 3. Refusals name their reason.
refused odd "the global batch 7 cannot be split over the world of 2 ranks" --global-batch 7 --layout auto
refused small "no layout of the .* considered fits the budget" --global-batch 128 --layout auto --max-memory 10M
refused zero "--layout auto chooses --zero itself" --global-batch 128 --layout auto --zero 1
refused zero0 "--layout auto chooses --zero itself" --global-batch 128 --layout auto --zero 0  # it ran ZeRO-1
refused link "--link-calibration .nope.json. does not exist" --global-batch 128 --layout auto \
  --link-calibration nope.json
echo "refusals name the batch, the budget and the flags"

# 4. ringtrain_plan: the same flags, nothing trained; a world it does not run in, from the link it is given.
timeout -k 5 300 mpirun -np 2 --oversubscribe "$build/ringtrain_plan" "${base[@]}" --global-batch 128 \
  --save-link link.json > save.log 2>&1 || { cat save.log; fail "ringtrain_plan --save-link"; }
grep -q "the link measured here is in link.json" save.log || { cat save.log; fail "--save-link said nothing"; }
python3 -c "import json; l = json.load(open('link.json'))['link']; assert l['bw_intra_bytes_per_s'] > 0" ||
  fail "link.json"
# One probe, 1 to 16 hosts (weak scaling): never faster than linear, efficiency and share per row.
timeout -k 5 300 "$build/ringtrain_plan" "${base[@]}" --global-batch 512 --hosts 16 --ranks-per-host 1 \
  --link 10Gbit --link-latency 30us --device-memory 8G --scaling --log-jsonl plan16.jsonl > plan16.log 2>&1 ||
  { cat plan16.log; fail "ringtrain_plan --hosts 16 --scaling"; }
grep -q "ringtrain_plan: 16 host(s) x 1 rank(s) (given)" plan16.log || { cat plan16.log; fail "what if 16 hosts"; }
! grep -q "^done:" plan16.log || fail "ringtrain_plan trained"
grep -q "ringtrain_plan: scaling at 32 images a rank" plan16.log || { cat plan16.log; fail "no scaling table"; }
scaling=$(python3 -c "
import json, sys
plan = [r for r in map(json.loads, open('plan16.jsonl')) if r['type'] == 'layout_plan'][-1]['layout']
rows = plan['scaling']
assert [r['hosts'] for r in rows] == [1, 2, 4, 8, 16], rows
one = rows[0]['images_per_s']
for r in rows:
    assert r['images_per_s'] <= r['hosts'] * one * (1 + 1e-9), ('superlinear', r, one)
    assert 0 < r['efficiency'] <= 1 + 1e-9 and 0 <= r['comm_share'] < 1, r
assert rows[-1]['comm_share'] > rows[0]['comm_share'], rows
print(' '.join('%.0f' % r['images_per_s'] for r in rows))
") || { cat plan16.log; fail "ringtrain_plan --scaling: $scaling"; }
"$build/ringtrain_plan" --synthetic --link fast > bad.log 2>&1 && fail "--link fast was taken"
grep -q -- "--link: expected a link rate from 1Mbit to 100Tbit" bad.log || { cat bad.log; fail "--link fast: no reason"; }
# Figures no link or world has are refused, naming them (they overflowed the model into inf and wrapped).
python3 -c "import json; l = json.load(open('link.json')); l['link']['bw_inter_bytes_per_s'] = 1e-300; \
json.dump(l, open('tiny.json', 'w'))"
refused tiny "'tiny.json': key 'link.bw_inter_bytes_per_s' must be a positive number from 125000 to 1e+15, got 1e-300" \
  --global-batch 128 --layout auto --link-calibration tiny.json
# Flags given by hand constrain the plan: --bucket-mb 0.5 is the chosen layout's (25 MB buckets ran before);
# --backend nccl on CPU ranks could not start, so it is refused.
timeout -k 5 300 mpirun -np 2 --oversubscribe "$build/ringtrain_plan" "${base[@]}" --global-batch 128 --bucket-mb 0.5 \
  > bucket.log 2>&1 || { cat bucket.log; fail "ringtrain_plan --bucket-mb 0.5"; }
grep -q "layout auto: chose .*--bucket-mb 0.5)" bucket.log || { cat bucket.log; fail "--bucket-mb 0.5 was not kept"; }
"$build/ringtrain_plan" --synthetic --backend nccl > bad.log 2>&1 && fail "--backend nccl was planned on CPU ranks"
grep -q -- "--backend nccl needs a GPU a rank, and these ranks train on the CPU" bad.log || { cat bad.log; fail "nccl: no reason"; }
"$build/ringtrain_plan" --synthetic --hosts 65537 --ranks-per-host 65536 > bad.log 2>&1 && fail "2^32 ranks were planned"
grep -q -- "--hosts 65537 x --ranks-per-host 65536 is 4295032832 ranks: ringtrain_plan plans worlds of up to" bad.log ||
  { cat bad.log; fail "a world past 2^24 ranks: no reason"; }
"$build/ringtrain_plan" --synthetic --link 1e-300Gbit > bad.log 2>&1 && fail "--link 1e-300Gbit was taken"
grep -q -- "--link '1e-300Gbit' is .* Gbit/s: expected a link rate from 1Mbit to 100Tbit" bad.log ||
  { cat bad.log; fail "--link 1e-300Gbit: no reason"; }
"$build/ringtrain_plan" --synthetic --save-link y.json --link-calibration link.json > bad.log 2>&1 &&
  fail "--save-link with --link-calibration was taken (it wrote the file's figures back as measured)"
grep -q -- "--save-link y.json writes the link measured between these ranks, and --link-calibration link.json" bad.log ||
  { cat bad.log; fail "--save-link with --link-calibration: no reason"; }
[[ ! -e y.json ]] || fail "--save-link with --link-calibration wrote y.json"
"$build/ringtrain_plan" --synthetic --save-link x.json > bad.log 2>&1 && fail "--save-link on one rank was taken"
grep -q -- "--save-link x.json: the link is measured between ranks" bad.log || { cat bad.log; fail "--save-link, 1 rank"; }
echo "ringtrain_plan --scaling, 1 to 16 hosts over 10 Gbit/s: $scaling img/s (never superlinear)"
echo "layout_auto test: PASS"
