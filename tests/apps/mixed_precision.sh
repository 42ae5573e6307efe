#!/usr/bin/env bash
# mixed_precision.sh BUILD_DIR WORK_DIR: train_resnet --precision bf16 and fp16 on 2 CPU ranks. fp16's
# loss scaler state travels in checkpoints: a run resumed mid-way ends bitwise identical to the
# uninterrupted one, with the same loss scale and skipped-step count.
set -euo pipefail
build=$1; work=$2
rm -rf "$work"; mkdir -p "$work"
mpi=(mpirun -np 2 --allow-run-as-root --oversubscribe)
common=(--synthetic -a resnet20 -b 8 --image-size 16 --threads 1 --lr 0.05)
"${mpi[@]}" "$build/train_resnet" "${common[@]}" --steps 4 --precision bf16 --log-jsonl "$work/bf16.jsonl" > /dev/null
"${mpi[@]}" "$build/train_resnet" "${common[@]}" --steps 6 --precision fp16 --checkpoint-dir "$work/a" --checkpoint-every 3 \
  --log-jsonl "$work/a.jsonl" > /dev/null
"${mpi[@]}" "$build/train_resnet" "${common[@]}" --steps 6 --precision fp16 --checkpoint-dir "$work/b" \
  --resume "$work/a/ckpt-step00000003.h5" --log-jsonl "$work/b.jsonl" > /dev/null
"$build/tests/compare_checkpoints" "$work/a/ckpt-step00000006.h5" "$work/b/ckpt-step00000006.h5"
/usr/bin/python3 - "$work" <<'PY'
import json, math, sys
def summary(name):
    return [json.loads(l) for l in open(f"{sys.argv[1]}/{name}.jsonl")][-1]
bf16, a, b = summary("bf16"), summary("a"), summary("b")
assert bf16["precision"] == "bf16" and "loss_scale" not in bf16 and math.isfinite(bf16["train_loss"]), bf16
assert a["precision"] == "fp16" and a["loss_scale"] > 0, a
# The scaler starts at 65536; ResNet-20's first f16 backward overflows there at least once.
assert a["skipped_steps"] >= 1 and a["loss_scale"] < 65536, a
assert b["loss_scale"] == a["loss_scale"], (a, b)
print("mixed precision ok: bf16 loss", round(bf16["train_loss"], 4), "fp16 scale", a["loss_scale"],
      "skipped", a["skipped_steps"])
PY
