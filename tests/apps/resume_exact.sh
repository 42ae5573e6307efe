#!/usr/bin/env bash
# resume_exact.sh BUILD_DIR WORK_DIR: a 2-rank CPU run of 6 steps with a checkpoint every 3, and a second
# run resumed from the step-3 checkpoint, must end with bitwise identical parameters and optimizer
# state. Also checks the JSONL schema, the merged trace, that a resume at a different global batch is
# refused, and that one at the same global batch on another world size continues at the right sample.
set -euo pipefail
build=$1; work=$2
rm -rf "$work"; mkdir -p "$work"
mpi=(mpirun -np 2 --allow-run-as-root --oversubscribe)
"$build/make_shards" synthetic "$work/data" --shape 12x12x3 --count 400 --classes 5 --shards 2 > /dev/null
common=(--data "$work/data" -a resnet20 --steps 6 --log-every 2 --lr 0.05 --threads 1)
"${mpi[@]}" "$build/train_resnet" "${common[@]}" -b 8 --checkpoint-dir "$work/a" --checkpoint-every 3 --log-jsonl "$work/a.jsonl" --trace "$work/a.trace.json"
"${mpi[@]}" "$build/train_resnet" "${common[@]}" -b 8 --checkpoint-dir "$work/b" --resume "$work/a/ckpt-step00000003.h5"
"$build/tests/compare_checkpoints" "$work/a/ckpt-step00000006.h5" "$work/b/ckpt-step00000006.h5"
python3 - "$work/a.jsonl" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
kinds = [r["type"] for r in records]
assert kinds.count("summary") == 1 and kinds[-1] == "summary", kinds
s = records[-1]
for key in ("train_loss", "test_top1", "test_top5", "img_per_s", "median_step_s", "peak_mem_bytes", "world_size", "steps"):
    assert key in s, f"summary lacks {key}: {s}"
assert 0 <= s["test_top1"] <= s["test_top5"] <= 1 and s["world_size"] == 2 and s["steps"] == 6, s
# GPU-only keys (peak_gpu_mem_bytes, cudnn_conv_algorithms) are checked by scripts/gpu_check.sh.
assert s["device"] == "cpu" and "peak_gpu_mem_bytes" not in s and "cudnn_conv_algorithms" not in s, s
train = [r for r in records if r["type"] == "train"]
parts = {"data_wait", "forward", "backward", "exposed_comm", "optimizer"}
assert train and all(set(r["time"]) == parts for r in train)
# What scripts/scaling.py and scripts/scaling_model.py read: the plan first, the summary's breakdown and buckets.
plan = records[0]
assert plan["type"] == "plan" and plan["world_size"] == 2 and plan["global_batch"] == 16, plan
assert plan["buckets"] and sum(b["numel"] for b in plan["buckets"]) == plan["params"] > 0, plan
assert set(s["breakdown_s"]) == parts and s["breakdown_steps"] == 5 and s["breakdown_s"]["backward"] > 0, s
assert [b["bytes"] for b in s["buckets"]] == [b["bytes"] for b in plan["buckets"]], s
ready = [b["ready_s"] for b in s["buckets"]]
assert all(0 <= r <= s["breakdown_s"]["backward"] * 1.5 for r in ready) and ready == sorted(ready), (ready, s)
assert 0 < s["median_step_s"] < s["elapsed_s"], s
print("jsonl schema ok:", len(records), "records")
PY
python3 - "$work/a.trace.json" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
spans = [e for e in events if e["ph"] == "X"]
assert {e["pid"] for e in spans} == {0, 1}, "one process per rank"
names = {e["name"] for e in spans}
for n in ("data_wait", "forward", "backward", "exposed_comm", "optimizer", "allreduce bucket 0"):
    assert n in names, f"trace lacks {n}: {sorted(names)}"
assert all(e["dur"] >= 0 for e in spans)
print("trace ok:", len(spans), "spans")
PY
if out=$("${mpi[@]}" "$build/train_resnet" "${common[@]}" -b 4 --resume "$work/a/ckpt-step00000003.h5" 2>&1); then
  echo "FAIL: a resume at a different global batch was accepted"; exit 1
fi
echo "$out" | grep -q "resume with the same global batch" || { echo "FAIL: unexpected error: $out"; exit 1; }
echo "resume at another global batch refused"
# Another world size at the same global batch: 1 rank x 8 x accum 2 continues 2 ranks x 8.
out=$(mpirun -np 1 --allow-run-as-root "$build/train_resnet" "${common[@]}" -b 8 --accum-steps 2 \
      --checkpoint-dir "$work/c" --resume "$work/a/ckpt-step00000003.h5")
echo "$out" | grep -q "resumed from .*: step 3, epoch 0, batch 6" || { echo "FAIL: position not converted: $out"; exit 1; }
echo "$out" | grep -q "done: 6 steps" || { echo "FAIL: resumed 1-rank run did not finish: $out"; exit 1; }
echo "resume on 1 rank with accumulation ok"
# --resume auto picks the newest checkpoint; relaunching a finished run trains nothing and overwrites nothing.
out=$("${mpi[@]}" "$build/train_resnet" "${common[@]}" -b 8 --checkpoint-dir "$work/a" --resume auto)
echo "$out" | grep -q "resumed from .*ckpt-step00000006.h5: step 6" || { echo "FAIL: --resume auto: $out"; exit 1; }
"$build/tests/compare_checkpoints" "$work/a/ckpt-step00000006.h5" "$work/b/ckpt-step00000006.h5" > /dev/null
echo "resume auto ok"
