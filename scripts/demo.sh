#!/usr/bin/env bash
# scripts/demo.sh: the end-to-end job on built-in data. Converts Debian's Fashion-MNIST
# (dataset-fashion-mnist) to shard files once, then trains ResNet-20 on it with 2 data-parallel ranks
# for one epoch and prints the test accuracy.
#   bash scripts/demo.sh [extra train_resnet flags, e.g. --epochs 5]
# Environment: BUILD_DIR (default build), DEMO_DIR (default $BUILD_DIR/demo), RANKS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
demo=${DEMO_DIR:-$build/demo}
ranks=${RANKS:-2}
source_dir=/usr/share/datasets/fashion-mnist
[[ -x "$build/train_resnet" ]] || { echo "demo: $build/train_resnet missing: run scripts/setup.sh first" >&2; exit 1; }
[[ -d "$source_dir" ]] || { echo "demo: $source_dir missing: apt-get install dataset-fashion-mnist (scripts/setup.sh does)" >&2; exit 1; }
if [[ ! -f "$demo/fashion-mnist/manifest.json" ]]; then
  echo "demo: converting Fashion-MNIST to shards in $demo/fashion-mnist"
  "$build/make_shards" fashion-mnist "$source_dir" "$demo/fashion-mnist" --shards 4
fi
mpi=(mpirun -np "$ranks")
[[ $(id -u) -eq 0 ]] && mpi+=(--allow-run-as-root)
(( $(nproc) < ranks )) && mpi+=(--oversubscribe)
# The recipe of docs/RESULTS.md: ResNet-20, global batch 128, SGD 0.1 momentum 0.9 wd 5e-4, cosine,
# random crop (pad 4) and horizontal flip.
"${mpi[@]}" "$build/train_resnet" --data "$demo/fashion-mnist" -a resnet20 -b $((128 / ranks)) --epochs 1 \
  --lr 0.1 --momentum 0.9 --wd 5e-4 --lr-schedule cosine --log-every 100 \
  --checkpoint-dir "$demo/checkpoints" --log-jsonl "$demo/train.jsonl" "$@"
