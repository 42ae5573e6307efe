#!/usr/bin/env bash
# bf16 against fp32 accuracy on the demo's schedule: ResNet-20 on Fashion-MNIST, one epoch, 2 ranks,
# batch 128, SGD lr 0.1 momentum 0.9 wd 5e-4 cosine (scripts/demo.sh), once per precision and seed.
# One epoch's accuracy moves by a point or two with float rounding alone (docs/RESULTS.md), so it runs
# several seeds and compares the means; it prints each run's test top-1 and the mean difference.
#
#   BUILD_DIR=build bash scripts/bf16_accuracy.sh [seeds...]      # default seeds: 1 2 3
#
# The bf16 path this CPU takes (core/cpu_features.h) is printed first; RINGTRAIN_CPU_BF16 forces one.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
work=${WORK_DIR:-$build/bf16_accuracy}
ranks=${RANKS:-2}
seeds=("$@")
(( ${#seeds[@]} )) || seeds=(1 2 3)
source_dir=/usr/share/datasets/fashion-mnist
[[ -x "$build/train_resnet" ]] || { echo "bf16_accuracy: $build/train_resnet missing: run scripts/setup.sh" >&2; exit 1; }
[[ -d "$source_dir" ]] || { echo "bf16_accuracy: $source_dir missing: apt-get install dataset-fashion-mnist" >&2; exit 1; }
mkdir -p "$work"
[[ -f "$work/fashion-mnist/manifest.json" ]] ||
  "$build/make_shards" fashion-mnist "$source_dir" "$work/fashion-mnist" --shards 4 > /dev/null 2>&1
mpi=(mpirun -np "$ranks")
[[ $(id -u) -eq 0 ]] && mpi+=(--allow-run-as-root)
(( $(nproc) < ranks )) && mpi+=(--oversubscribe)
"$build/ringtrain_env" | grep -i "precision bf16 on the cpu" | sed 's/^ */# /'
declare -A sum=([fp32]=0 [bf16]=0)
for seed in "${seeds[@]}"; do
  for precision in fp32 bf16; do
    run="$work/$precision-seed$seed"
    rm -rf "$run"
    start=$(date +%s)
    timeout 1800 "${mpi[@]}" "$build/train_resnet" --data "$work/fashion-mnist" -a resnet20 -b $((128 / ranks)) \
      --epochs 1 --lr 0.1 --momentum 0.9 --wd 5e-4 --lr-schedule cosine --log-every 1000 --seed "$seed" \
      --precision "$precision" --checkpoint-dir "$run/checkpoints" --log-jsonl "$run/train.jsonl" > "$run.log" 2>&1 ||
      { echo "bf16_accuracy: $precision seed $seed failed; see $run.log" >&2; exit 1; }
    top1=$(python3 -c 'import json,sys
recs=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(100*[r for r in recs if r.get("type")=="eval"][-1]["test_top1"])' "$run/train.jsonl")
    printf '%s seed %s: test top-1 %.2f%% (%d s)\n' "$precision" "$seed" "$top1" $(( $(date +%s) - start ))
    sum[$precision]=$(python3 -c "print(${sum[$precision]} + $top1)")
  done
done
python3 - "${sum[fp32]}" "${sum[bf16]}" "${#seeds[@]}" <<'EOF'
import sys
fp32, bf16, n = float(sys.argv[1]) / int(sys.argv[3]), float(sys.argv[2]) / int(sys.argv[3]), int(sys.argv[3])
print(f"mean over {n} seed(s): fp32 {fp32:.2f}%, bf16 {bf16:.2f}%, bf16 - fp32 {bf16 - fp32:+.2f} points "
      f"(goal: within 0.5: {'met' if abs(bf16 - fp32) <= 0.5 or bf16 > fp32 else 'NOT met'})")
EOF
