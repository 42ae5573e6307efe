#!/usr/bin/env bash
# model_families.sh BUILD_DIR WORK_DIR ARCH: one of today's CNNs (mobilenet_v2, efficientnet_b0, convnext_tiny, unet)
# through train_resnet on 2 ranks from shard files, with every part of the runtime the ResNets have:
#   - 2 pipeline stages train 1 process's bits (the model's blocks, drop_path keyed by sample and step);
#   - 2 data-parallel ranks are 1 process with the same micro-batches, to float noise; --zero 1, --recompute and a
#     resume from the middle train their plain run's bits;
#   - --layout auto trains its chosen flags' bits; --precision bf16 and accumulation train;
#   - the memory plan's prediction is within 10% of the measured peak;
#   - a model of the other task than the data's is refused naming both;
#   - a short run learns: the loss falls and the test accuracy (segmentation: pixel accuracy) beats chance widely.
set -euo pipefail
build=$(cd "$1" && pwd); work=$2; arch=$3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "model families test ($arch): FAIL: $*"; exit 1; }
same() {  # A B WHAT [RTOL]: bitwise, or within RTOL of each tensor's scale without the batch norms' statistics
  "$build/tests/compare_checkpoints" "$1" "$2" ${4:+--rtol "$4" --without-bn-statistics} > /dev/null ||
    fail "$3: $1 and $2 differ"
}
if [[ $arch == unet* ]]; then
  "$build/make_shards" synthetic-segmentation data --size 32 --count 192 --classes 4 --shards 2 --quiet > /dev/null
  chance=25; metric="pixel accuracy"
else
  "$build/make_shards" synthetic data --shape 32x32x3 --count 384 --classes 5 --shards 2 --quiet > /dev/null
  chance=20; metric="top-1"
fi
base=(--data data -a "$arch" --steps 4 --lr 0.02 --threads 1 --log-every 1 --checkpoint-every 2 --seed 3)
run() {  # NAME NP ARGS...: its output in NAME.log, its checkpoints in NAME/
  local name=$1 np=$2; shift 2
  timeout -k 5 300 mpirun -np "$np" "$build/train_resnet" "${base[@]}" --checkpoint-dir "$name" "$@" > "$name.log" 2>&1 ||
    { cat "$name.log"; fail "$name: $*"; }
}
final=ckpt-step00000004.h5

# A model of the other task than the data's is refused before anything runs, naming both.
if [[ $arch == unet* ]]; then other=(-a mobilenet_v2); want="predicts a class per image.*per-pixel masks"
else other=(-a unet); want="predicts a class per pixel.*a label per image"; fi
if timeout -k 5 60 "$build/train_resnet" --data data "${other[@]}" --steps 1 --threads 1 > mismatch.log 2>&1; then
  fail "${other[*]} trained on data of the other task"
fi
grep -Eq "$want" mismatch.log || { cat mismatch.log; fail "the task mismatch is not named"; }

# Pipeline stages: the model's blocks split over 2 ranks train 1 process's bits (same micro-batches).
run one 1 -b 8 --accum-steps 2
run stages 2 -b 8 --accum-steps 2 --pipeline-stages 2
same one/$final stages/$final "2 pipeline stages against 1 process"
# Data parallelism: 2 ranks of micro-batches of 4 are 1 process's micro-batches of 4, to the order of the sums,
# over one step (training amplifies rounding step by step; docs/VALIDATION.md). The batch norms' running statistics
# aside: each rank moves its own with its micro-batches.
run dp1 2 -b 4 --accum-steps 2 --steps 1
run one4 1 -b 4 --accum-steps 4 --steps 1
same dp1/ckpt-step00000001.h5 one4/ckpt-step00000001.h5 "2 data-parallel ranks against 1 process" 1e-4
# ZeRO-1, recompute and a resume from the middle: the plain run's bits (checkpoints at the same steps: writing one
# averages the ranks' batch norm statistics).
run dp 2 -b 4 --accum-steps 2 --log-jsonl dp.jsonl
run zero 2 -b 4 --accum-steps 2 --zero 1
same dp/$final zero/$final "--zero 1"
run recompute 2 -b 4 --accum-steps 2 --recompute
grep -q "^recompute: [0-9]* of the model's [0-9]* blocks keep only their input" recompute.log ||
  { cat recompute.log; fail "no recompute line"; }
same dp/$final recompute/$final "--recompute"
mkdir -p resumed && cp dp/ckpt-step00000002.h5 resumed/
run resumed 2 -b 4 --accum-steps 2 --resume auto
grep -q "resumed from resumed/ckpt-step00000002.h5" resumed.log || { cat resumed.log; fail "not resumed from step 2"; }
same dp/$final resumed/$final "a resume from step 2"
echo "$arch: 2 stages = 1 process, 2 ranks = 1 process (to float noise), --zero 1, --recompute and a resume: bitwise"

# The memory plan against the measured peak (the summary has both).
python3 - dp.jsonl "$arch" <<'PY' || fail "the memory plan"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
p, m = s["predicted_peak_mem_bytes"], s["peak_mem_bytes"]
err = abs(p - m) / m
print(f"{sys.argv[2]}: memory plan predicted {p / 2**20:.1f} MiB, measured {m / 2**20:.1f} MiB ({100 * err:.1f}% off)")
assert err <= 0.10, f"the prediction is {100 * err:.1f}% off the measured peak"
PY

# --layout auto: it chooses, and trains the chosen flags' bits.
run auto 2 --global-batch 16 --layout auto --log-jsonl auto.jsonl
chosen=$(python3 -c "
import json
p = next(json.loads(l) for l in open('auto.jsonl') if '\"type\":\"plan\"' in l.replace(' ', ''))
print(p['layout']['chosen']['flags'])")
# shellcheck disable=SC2086
run hand 2 $chosen
same auto/$final hand/$final "--layout auto against its flags by hand ($chosen)"
echo "$arch: --layout auto chose '$chosen' and trains its bits"
# bf16 autocast trains (finite losses).
run bf16 2 -b 4 --accum-steps 2 --precision bf16
grep -q "^done: 4 steps" bf16.log || { cat bf16.log; fail "--precision bf16"; }

# It learns: the loss falls over a short run and the test figure beats chance by a wide margin.
# (The synthetic classes are random pixel templates, which a shifted or flipped crop would scramble: no augmentation
# for them; the segmentation shapes keep theirs, which their masks follow.)
steps=60
[[ $arch == efficientnet* ]] && learn=(--lr 0.005) || learn=(--lr 0.05)
[[ $arch == unet* ]] || learn+=(--pad-crop 0 --no-hflip)
timeout -k 5 600 mpirun -np 2 "$build/train_resnet" --data data -a "$arch" -b 16 --steps $steps --threads 1 \
  --log-every 5 --seed 3 "${learn[@]}" --log-jsonl learn.jsonl > learn.log 2>&1 || { cat learn.log; fail "the learning run"; }
python3 - learn.jsonl "$arch" "$chance" "$metric" <<'PY' || { cat learn.log; fail "it did not learn"; }
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
losses = [r["loss"] for r in records if r["type"] == "train"]
ev = [r for r in records if r["type"] == "eval"][-1]
first, last, acc = sum(losses[:2]) / 2, sum(losses[-2:]) / 2, 100 * ev["test_top1"]
print(f"{sys.argv[2]}: loss {first:.3f} -> {last:.3f}, test {sys.argv[4]} {acc:.1f}% (chance {sys.argv[3]}%)")
assert last < 0.8 * first, "the loss did not fall"
assert acc > 2 * float(sys.argv[3]), "not above twice chance"
PY
echo "model families test ($arch): PASS"
