#!/usr/bin/env bash
# small_unet.sh BUILD_DIR WORK_DIR: the library guide's segmentation example (apps/examples/small_unet.cpp, a UNet
# written from cat, upsample and GroupNorm) trains data-parallel on 2 ranks from synthetic segmentation shards and
# learns: the loss falls and the test mean IoU ends far above what predicting the background everywhere gives.
# It refuses data of a label per image, naming it.
set -euo pipefail
build=$(cd "$1" && pwd); work=$2
rm -rf "$work"; mkdir -p "$work"; cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "small_unet test: FAIL: $*"; exit 1; }
"$build/make_shards" synthetic-segmentation seg --size 16 --count 256 --classes 4 --shards 2 --quiet > /dev/null
timeout -k 5 300 mpirun -np 2 "$build/small_unet" --data seg --epochs 10 -b 16 --lr 0.1 --threads 1 --width 8 --log-every 8 \
  --log-jsonl run.jsonl > run.log 2>&1 || { cat run.log; fail "training"; }
grep -q "epoch 10: test pixel accuracy" run.log || { cat run.log; fail "no per-pixel evaluation"; }
python3 - run.jsonl <<'PY' || { cat run.log; fail "it did not learn"; }
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
losses = [r["loss"] for r in records if r["type"] == "train"]
ev = [r for r in records if r["type"] == "eval"][-1]
first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
print(f"small_unet: loss {first:.3f} -> {last:.3f}, test pixel accuracy {100 * ev['test_pixel_accuracy']:.1f}%, "
      f"mean IoU {100 * ev['test_miou']:.1f}%")
assert last < 0.3 * first, "the loss did not fall"
# Predicting the background everywhere scores one class's IoU: at most 25% of the mean over 4 classes.
assert ev["test_miou"] > 0.7, "mean IoU not above 70%"
PY
"$build/make_shards" synthetic labels --shape 16x16x3 --count 64 --classes 4 --quiet > /dev/null
if timeout -k 5 60 "$build/small_unet" --data labels --steps 1 --threads 1 > labels.log 2>&1; then
  fail "trained on data of a label per image"
fi
grep -q "holds a label per image: small_unet needs per-pixel masks" labels.log || { cat labels.log; fail "no clear error"; }
echo "small_unet test: PASS"
