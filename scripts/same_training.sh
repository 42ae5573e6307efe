#!/usr/bin/env bash
# scripts/same_training.sh OLD_BUILD NEW_BUILD [WORK_DIR]: proves that a change left the training
# arithmetic alone. Runs the same short trainings with both builds' train_resnet and custom_model
# (1 and 2 ranks; accumulation, ZeRO-1 with clipping, fp16 loss scaling, SyncBN, pipeline stages,
# activation recompute, --layout auto, the emulated CUDA graph, a resume) on
# Fashion-MNIST and compares every checkpoint bitwise (NEW_BUILD's compare_checkpoints). Prints one
# line per configuration and exits non-zero when any differs. Refactors of the loop use it.
#   bash scripts/same_training.sh /tmp/build-before build
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2")
work=${3:-$(mktemp -d /tmp/same_training.XXXXXX)}
mkdir -p "$work"
data=$work/fashion-mnist
if [[ ! -f $data/manifest.json ]]; then
  "$new/make_shards" fashion-mnist /usr/share/datasets/fashion-mnist "$data" --shards 4 > /dev/null
fi
mpi=(timeout 300 mpirun --allow-run-as-root --oversubscribe -x RINGTRAIN_THREADS=1)
common=(--data "$data" --lr 0.1 --log-every 5 --timeout 120)
# name | ranks | program | flags [| environment: NAME=VALUE ...]
# --layout auto chooses by measured times, which differ between any two runs: one rank's global batch of one
# image leaves it one layout (ZeRO-1 on or off, the same arithmetic), so the two builds train the same.
configs=(
  "demo|2|train_resnet|-a resnet20 -b 64 --steps 12 --checkpoint-every 6"
  "one-rank-accum|1|train_resnet|-a resnet20 -b 32 --accum-steps 2 --steps 6 --checkpoint-every 3 --nesterov"
  "zero-clip-adamw|2|train_resnet|-a resnet20 -b 32 --steps 6 --zero 1 --clip-grad-norm 1 --optimizer adamw --lr 0.01 --checkpoint-every 3"
  "fp16-syncbn|2|train_resnet|-a resnet20 -b 32 --steps 6 --precision fp16 --sync-bn --accum-steps 2 --checkpoint-every 3"
  "custom|2|custom_model|-b 32 --steps 8 --checkpoint-every 4 --label-smoothing 0.1"
  "pipeline|2|train_resnet|-a resnet20 -b 16 --accum-steps 4 --pipeline-stages 2 --steps 6 --checkpoint-every 3"
  "recompute|2|train_resnet|-a resnet20 -b 32 --accum-steps 2 --steps 6 --recompute --checkpoint-every 3"
  "layout-auto|1|train_resnet|-a resnet20 -b 1 --lr 0.01 --steps 6 --layout auto --checkpoint-every 3"
  "cuda-graph-emulated|1|train_resnet|-a resnet20 -b 32 --accum-steps 2 --steps 8 --cuda-graph --checkpoint-every 4|RINGTRAIN_CUDA_GRAPH_EMULATE=1"
)
status=0
for c in "${configs[@]}"; do
  IFS='|' read -r name ranks program flags environment <<< "$c"
  env_flags=()
  for e in $environment; do env_flags+=(-x "$e"); done
  for side in old new; do
    build=${!side}
    dir=$work/$name/$side
    rm -rf "$dir" && mkdir -p "$dir"
    # shellcheck disable=SC2086
    "${mpi[@]}" "${env_flags[@]}" -np "$ranks" "$build/$program" "${common[@]}" $flags --checkpoint-dir "$dir/ckpt" \
      > "$dir/out.txt" 2>&1 ||
      { echo "$name: $side build failed (see $dir/out.txt)"; status=1; continue 2; }
    # Resume from the first checkpoint and run to the end again: the resumed run must land on the same bits.
    first=$(ls "$dir/ckpt"/ckpt-step*.h5 | head -1)
    # shellcheck disable=SC2086
    "${mpi[@]}" "${env_flags[@]}" -np "$ranks" "$build/$program" "${common[@]}" $flags --checkpoint-dir "$dir/resumed" \
      --resume "$first" > "$dir/resume.txt" 2>&1 || { echo "$name: $side resume failed"; status=1; continue 2; }
  done
  verdict=identical
  for f in "$work/$name/old/ckpt"/ckpt-step*.h5; do
    b=$work/$name/new/ckpt/$(basename "$f")
    if ! "$new/tests/compare_checkpoints" "$f" "$b" > /dev/null 2>&1; then verdict="differs at $(basename "$f")"; status=1; fi
  done
  last=$(ls "$work/$name/old/ckpt"/ckpt-step*.h5 | tail -1)
  for side in old new; do
    r=$work/$name/$side/resumed/$(basename "$last")
    if ! "$new/tests/compare_checkpoints" "$last" "$r" > /dev/null 2>&1; then verdict="$verdict; $side resume differs"; status=1; fi
  done
  echo "$name ($ranks rank(s), $program): $verdict ($(ls "$work/$name/old/ckpt" | wc -l) checkpoints)"
done
exit $status
