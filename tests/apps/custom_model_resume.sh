#!/usr/bin/env bash
# custom_model_resume.sh BUILD_DIR WORK_DIR: the library example gets the runtime's flags with no code of
# its own. A 2-rank run of 6 steps with a checkpoint every 3, and a run resumed from the step-3 checkpoint,
# end bitwise identical; --resume auto continues a longer run from the newest checkpoint; --log-jsonl,
# --trace, --timeout, --seed and --keep-last work as in train_resnet.
set -euo pipefail
build=$1; work=$2
rm -rf "$work"; mkdir -p "$work"
mpi=(timeout 240 mpirun -np 2 --allow-run-as-root --oversubscribe)
"$build/make_shards" synthetic "$work/data" --shape 10x10x3 --count 300 --classes 4 --shards 2 > /dev/null
common=(--data "$work/data" -b 8 --steps 6 --lr 0.05 --threads 1 --seed 3 --timeout 120 --log-every 2)
"${mpi[@]}" "$build/custom_model" "${common[@]}" --checkpoint-dir "$work/a" --checkpoint-every 3 \
  --log-jsonl "$work/a.jsonl" --trace "$work/a.trace.json" > "$work/a.log"
grep -q "custom_model: custom-cnn on cpu, 2 rank(s)" "$work/a.log" || { cat "$work/a.log"; exit 1; }
grep -q "test top-1 .*(60 images)" "$work/a.log" || { echo "FAIL: no exact evaluation"; cat "$work/a.log"; exit 1; }
"${mpi[@]}" "$build/custom_model" "${common[@]}" --checkpoint-dir "$work/b" --resume "$work/a/ckpt-step00000003.h5" > "$work/b.log"
grep -q "resumed from .*ckpt-step00000003.h5: step 3" "$work/b.log" || { cat "$work/b.log"; exit 1; }
"$build/tests/compare_checkpoints" "$work/a/ckpt-step00000006.h5" "$work/b/ckpt-step00000006.h5"
/usr/bin/python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
records = [json.loads(l) for l in open(f"{w}/a.jsonl")]
kinds = [r["type"] for r in records]
assert kinds[0] == "plan" and kinds[-1] == "summary" and "train" in kinds and "eval" in kinds, kinds
assert records[0]["arch"] == "custom-cnn" and records[-1]["steps"] == 6, records[-1]
events = json.load(open(f"{w}/a.trace.json"))["traceEvents"]
assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}
print("custom_model jsonl and trace ok")
PY
# A longer run resumed automatically from the newest checkpoint of the same folder, keeping only two.
"${mpi[@]}" "$build/custom_model" "${common[@]}" --steps 9 --checkpoint-dir "$work/a" --checkpoint-every 3 \
  --keep-last 2 --resume auto > "$work/c.log"
grep -q "resumed from .*ckpt-step00000006.h5: step 6" "$work/c.log" || { cat "$work/c.log"; exit 1; }
grep -q "done: 9 steps" "$work/c.log" || { cat "$work/c.log"; exit 1; }
ls "$work/a" | tr '\n' ' ' | grep -qx "ckpt-step00000006.h5 ckpt-step00000009.h5 " || { echo "FAIL: keep-last: $(ls "$work/a")"; exit 1; }
echo "custom_model resume ok"
