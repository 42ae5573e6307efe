#!/usr/bin/env bash
# scripts/bench_vs_pytorch.sh: CPU training-step time of ringtrain's ResNet against PyTorch's in the same
# run (../shared/peers/torch_resnet_step.py), for each thread count and batch size, with the ratio
# ringtrain / PyTorch (below 1 is faster). Usage: scripts/bench_vs_pytorch.sh [ARCH_DEPTH=20] [STEPS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
depth=${1:-20}
steps=${2:-5}
peer=${PEER:-../shared/peers/torch_resnet_step.py}
[[ -x build/bench_step ]] || { echo "build/bench_step missing: run scripts/setup.sh" >&2; exit 1; }
printf "%-8s %-7s %-12s %-12s %-7s %-10s %-10s\n" threads batch ours_step_s torch_step_s ratio ours_rss_mb
for threads in 1 2; do
  for batch in 32 128; do
    ours=$(./build/bench_step -a "resnet$depth" -b "$batch" --threads "$threads" --steps "$steps")
    torch_line=$(/usr/bin/python3 "$peer" "$depth" "$batch" "$threads" "$steps")
    o=$(echo "$ours" | sed -n 's/.*median_step_s=\([0-9.]*\).*/\1/p')
    r=$(echo "$ours" | sed -n 's/.*peak_rss_mb=\([0-9.]*\).*/\1/p')
    t=$(echo "$torch_line" | sed -n 's/.*median_step_s=\([0-9.]*\).*/\1/p')
    printf "%-8s %-7s %-12s %-12s %-7s %-10s\n" "$threads" "$batch" "$o" "$t" "$(python3 -c "print(f'{$o/$t:.2f}')")" "$r"
  done
done
