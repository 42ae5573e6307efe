#!/usr/bin/env bash
# scripts/bench_recovery.sh: what a lost node costs under ringtrain_run, on the emulated cluster
# (scripts/cluster.sh; needs root). 2 nodes x 1 rank train from shards with a checkpoint every
# CKPT_EVERY steps (10 for ResNet-20, 5 for ResNet-50); half an interval after the checkpoint of step
# 2 x CKPT_EVERY, node1 is killed (every process at once, the node down). Measured per model, REPEATS times, medians:
#   detect+probe  the kill -> ringtrain_run's restart record (mpirun ends the job, the hosts are probed)
#   relaunch      the restart record -> the relaunched job's first step (mpirun start, MPI init, data
#                 open, checkpoint load, the first step on node0 alone with --accum-steps 2)
#   recovery      the kill -> that first step (the sum; the issue's goal: under 60 s)
#   lost steps    steps done after the checkpoint the relaunch resumed (the kill lands half an interval
#                 after the checkpoint: CKPT_EVERY / 2 expected, at most CKPT_EVERY)
#   checkpoint    the size of one checkpoint file (model + optimizer state)
#   scripts/bench_recovery.sh [REPEATS=3] [MODELS="resnet20 resnet50"]   (BUILD_DIR: default build)
# Results: a markdown table on stdout and bench-recovery/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}; models=${2:-resnet20 resnet50}
build=$(cd "${BUILD_DIR:-build}" && pwd)
src=$PWD
for exe in ringtrain_run train_resnet make_shards; do
  [[ -x $build/$exe ]] || { echo "bench_recovery.sh: $build/$exe missing: run scripts/setup.sh" >&2; exit 1; }
done
export RT_CLUSTER_PREFIX=rtb RT_CLUSTER_NET=10.213.9 RT_CLUSTER_STATE=/run/ringtrain-cluster-bench
cluster=$src/scripts/cluster.sh
out=$src/bench-recovery
work=$(mktemp -d)
rm -rf "$out"; mkdir -p "$out"
trap '"$cluster" down > /dev/null 2>&1; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
"$cluster" down > /dev/null 2>&1 || true
"$cluster" up 2 > /dev/null

# Per model: the shard shape, the per-rank batch, the steps, and when to kill.
declare -A shape=([resnet20]=32x32x3 [resnet50]=64x64x3) batch=([resnet20]=32 [resnet50]=8) classes=([resnet20]=10 [resnet50]=100)
declare -A every=([resnet20]=10 [resnet50]=5)
printf '| model | checkpoint | detect+probe s | relaunch s | recovery s | lost steps (checkpoint every) | step s before / after |\n' > "$out/summary.md"
printf '|---|---|---|---|---|---|---|\n' >> "$out/summary.md"
for model in $models; do
  "$build/make_shards" synthetic "$work/data-$model" --shape "${shape[$model]}" --count 4096 --classes "${classes[$model]}" \
    --shards 2 > /dev/null 2>&1
  ckpt_every=${every[$model]}; kill_after=$((2 * ckpt_every)); steps=$((3 * ckpt_every))
  for rep in $(seq "$repeats"); do
    run=$work/$model-$rep
    ( timeout -k 5 1200 "$cluster" exec node0 "$build/ringtrain_run" --mpirun-args "$("$cluster" mpirun-args)" --np 2 \
        --probe-timeout 5 -- "$build/train_resnet" --data "$work/data-$model" -a "$model" -b "${batch[$model]}" \
        --steps "$steps" --log-every 1 --threads 1 --checkpoint-dir "$run" --checkpoint-every "$ckpt_every" \
        --log-jsonl "$run.jsonl" > "$run.log" 2>&1; echo $? > "$run.rc" ) &
    ck=$(printf "%s/ckpt-step%08d.h5" "$run" "$kill_after")
    # The kill lands half an interval after the checkpoint: the average failure loses that much work.
    at=$((kill_after + ckpt_every / 2))
    for _ in $(seq 12000); do
      [[ -f $run.rc ]] && break
      grep -q "\"step\":$at," "$run.jsonl" 2> /dev/null && break
      sleep 0.05
    done
    [[ -f $ck && ! -f $run.rc ]] || { cat "$run.log"; echo "bench_recovery.sh: $model: the run never reached step $at" >&2; exit 1; }
    t0=$(date +%s.%N)
    "$cluster" kill node1 > /dev/null
    wait
    [[ $(cat "$run.rc") = 0 ]] || { cat "$run.log"; echo "bench_recovery.sh: $model: the run failed" >&2; exit 1; }
    cp "$run.log" "$out/$model-$rep.log"
    /usr/bin/python3 - "$run.jsonl" "$t0" "$ck" >> "$work/$model.rows" << 'PY'
import json, os, sys
r = [json.loads(l) for l in open(sys.argv[1])]
t0 = float(sys.argv[2])
restart = next(x for x in r if x["type"] == "restart")
rec = next(x for x in r if x["type"] == "recovered")
train = [x for x in r if x["type"] == "train"]
before = [x["time"] for x in train if x["step"] <= restart["last_step"]]
step = lambda rows: sum(sum(t.values()) for t in rows) / max(len(rows), 1)
after = [x["time"] for x in train if x["step"] > rec["resumed_step"]]
print(restart["time"] - t0, rec["first_step_time"] - restart["time"], rec["first_step_time"] - t0, rec["lost_steps"],
      os.path.getsize(sys.argv[3]), step(before), step(after))
PY
    "$cluster" revive node1 > /dev/null
  done
  /usr/bin/python3 - "$work/$model.rows" "$model" "$ckpt_every" >> "$out/summary.md" << 'PY'
import statistics as st, sys
rows = [[float(v) for v in line.split()] for line in open(sys.argv[1])]
med = [st.median(col) for col in zip(*rows)]
lo = [min(col) for col in zip(*rows)]
hi = [max(col) for col in zip(*rows)]
print(f"| {sys.argv[2]} | {med[4] / 1e6:.0f} MB | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} ({lo[2]:.1f}-{hi[2]:.1f}) | "
      f"{med[3]:.0f} ({sys.argv[3]}) | {med[5]:.3f} / {med[6]:.3f} |")
PY
done
cat "$out/summary.md"
echo "($repeats repeat(s) each, medians; recovery's range in brackets. lscpu: $(lscpu | sed -n 's/^Model name: *//p'))"
