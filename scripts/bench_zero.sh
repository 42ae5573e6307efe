#!/usr/bin/env bash
# scripts/bench_zero.sh: what ZeRO-1 (train_resnet --zero 1) saves and costs, against the unsharded run in
# the same invocation. Three parts (PARTS, default "memory step cluster"):
#   memory   ResNet-50 and ResNet-152 with AdamW on 1, 2 and 4 ranks, ZeRO off and on: the optimizer
#            state per rank (the plan record's optimizer_state_bytes) against the goal state/N + the
#            largest bucket, and each rank's peak RSS (the summary's peak_mem_bytes_by_rank)
#   step     the median step time on 2 ranks of this machine, ZeRO off vs on, ROUNDS interleaved rounds
#            (ResNet-50, 64x64 synthetic images, batch 8 per rank, AdamW, 1 thread per rank, 30 steps), with
#            the summary's mean breakdown (forward includes waiting for the overlapped all-gather)
#   cluster  the same on the emulated 2-node cluster (scripts/cluster.sh, root; link RATE), 1 rank a node
#   scripts/bench_zero.sh [ROUNDS=3]       (BUILD_DIR: default build; RATE: default 1gbit)
# Results: markdown tables on stdout and in bench-zero/summary.md; every run's log in bench-zero/.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; parts=${PARTS:-memory step cluster}; rate=${RATE:-1gbit}
build=$(cd "${BUILD_DIR:-build}" && pwd)
src=$PWD
[[ -x $build/train_resnet ]] || { echo "bench_zero.sh: $build/train_resnet missing: run scripts/setup.sh" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export RT_CLUSTER_PREFIX=rtz RT_CLUSTER_NET=10.213.11 RT_CLUSTER_STATE=/run/ringtrain-cluster-zero
cluster=$src/scripts/cluster.sh
out=$src/bench-zero
work=$(mktemp -d)
rm -rf "$out"; mkdir -p "$out"
trap '[[ $parts == *cluster* ]] && "$cluster" down > /dev/null 2>&1; cp "$work"/*.jsonl "$out"/ 2> /dev/null; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# run NAME NP [train_resnet flags...]: one job; its JSONL log at $work/NAME.jsonl.
run() {
  local name=$1 np=$2; shift 2
  timeout -k 5 1800 mpirun -np "$np" --oversubscribe --bind-to none "$build/train_resnet" --synthetic --log-every 1000 \
    --log-jsonl "$work/$name.jsonl" "$@" > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; echo "bench_zero.sh: $name failed" >&2; exit 1; }
}

if [[ $parts == *memory* ]]; then
  for model in resnet50 resnet152; do
    for np in 1 2 4; do
      for zero in 0 1; do
        run "mem-$model-np$np-zero$zero" "$np" -a "$model" --image-size 32 -b 2 --steps 3 --optimizer adamw --lr 0.001 \
          --threads 1 --zero "$zero"
      done
    done
  done
  /usr/bin/python3 - "$work" >> "$out/summary.md" << 'PY'
import json, sys
work = sys.argv[1]
def load(name):
    recs = [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
    return next(r for r in recs if r["type"] == "plan"), next(r for r in recs if r["type"] == "summary")
print("| model | ranks | optimizer state / rank, off -> on (MB) | goal: state/N + largest bucket (MB) | on / goal | "
      "peak RSS / rank, off -> on (MB, largest rank) |")
print("|---|---|---|---|---|---|")
for model in ["resnet50", "resnet152"]:
    for np in [1, 2, 4]:
        plan0, sum0 = load(f"mem-{model}-np{np}-zero0")
        plan1, sum1 = load(f"mem-{model}-np{np}-zero1")
        full = max(plan0["optimizer_state_bytes"])
        mine = max(plan1["optimizer_state_bytes"])
        goal = full / np + max(b["bytes"] for b in plan1["buckets"])
        mb = lambda b: b / 1e6
        print(f"| {model} | {np} | {mb(full):.0f} -> {mb(mine):.1f} | {mb(goal):.1f} | {mine / goal:.2f} | "
              f"{mb(max(sum0['peak_mem_bytes_by_rank'])):.0f} -> {mb(max(sum1['peak_mem_bytes_by_rank'])):.0f} |")
print()
PY
fi

# step_rounds SLUG LABEL LAUNCH...: ROUNDS interleaved rounds of ZeRO off and on (LAUNCH NAME ZERO); prints
# a table row with the medians and the ratio.
step_rounds() {
  local prefix=$1 label=$2; shift 2
  for r in $(seq "$rounds"); do
    for zero in 0 1; do "$@" "$prefix-r$r-zero$zero" "$zero"; done
  done
  /usr/bin/python3 - "$work" "$prefix" "$rounds" "$label" << 'PY'
import json, statistics as st, sys
work, prefix, rounds, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def summary(name):
    recs = [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
    return next(r for r in recs if r["type"] == "summary")
off = [summary(f"{prefix}-r{r}-zero0") for r in range(1, rounds + 1)]
on = [summary(f"{prefix}-r{r}-zero1") for r in range(1, rounds + 1)]
ratios = [b["median_step_s"] / a["median_step_s"] for a, b in zip(off, on)]
med = lambda runs, key: st.median(r["median_step_s"] if key is None else r["breakdown_s"][key] for r in runs)
phases = " | ".join(f"{med(off, k):.3f} -> {med(on, k):.3f}" for k in ["forward", "backward", "exposed_comm", "optimizer"])
print(f"| {label} | {med(off, None):.3f} | {med(on, None):.3f} | {st.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | {phases} |")
PY
}
step_flags=(-a resnet50 --image-size 64 -b 8 --steps 30 --optimizer adamw --lr 0.001 --threads 1)
if [[ $parts == *step* || $parts == *cluster* ]]; then
  printf '| where | step s, ZeRO off | step s, ZeRO on | on / off, median of rounds (range) | forward s off -> on | backward s | exposed comm s | optimizer s |\n|---|---|---|---|---|---|---|---|\n' >> "$out/summary.md"
fi
if [[ $parts == *step* ]]; then
  local_run() { run "$1" 2 "${step_flags[@]}" --zero "$2"; }
  step_rounds step "2 ranks, this machine" local_run >> "$out/summary.md"
fi
if [[ $parts == *cluster* ]]; then
  "$cluster" down > /dev/null 2>&1 || true
  "$cluster" up 2 --rate "$rate" > /dev/null
  cluster_run() {
    timeout -k 5 1800 "$cluster" run -np 2 -- "$build/train_resnet" --synthetic --log-every 1000 \
      --log-jsonl "$work/$1.jsonl" "${step_flags[@]}" --zero "$2" > "$out/$1.log" 2>&1 ||
      { tail -20 "$out/$1.log"; echo "bench_zero.sh: $1 failed" >&2; exit 1; }
  }
  step_rounds cluster "2 nodes x 1 rank, $rate link" cluster_run >> "$out/summary.md"
  "$cluster" down > /dev/null
fi
cat "$out/summary.md"
echo "(lscpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; memory: 3 steps of 2 images at 32x32, 4 ranks"
echo " oversubscribing; step times: medians of $rounds interleaved rounds of 30 steps)"
