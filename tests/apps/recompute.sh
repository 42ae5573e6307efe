#!/usr/bin/env bash
# tests/apps/recompute.sh BUILD_DIR WORK_DIR: --recompute through the apps trains the plain run's bits.
#   ResNet-20 (-b 8, --accum-steps 2, evaluation on) on 1 process; 2 ranks with --sync-bn and with --zero 1;
#   2 pipeline stages (each stage's blocks checkpointed); the custom model with dropout; a resume without it;
#   --recompute with --pipeline-recompute refused naming both.
set -euo pipefail
build=$(cd "$1" && pwd); work=$2
rm -rf "$work"; mkdir -p "$work"; cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "recompute test: FAIL: $*"; exit 1; }
mpi() { local np=$1; shift; timeout -k 5 300 mpirun -np "$np" "$@"; }
same() { "$build/tests/compare_checkpoints" "$1" "$2" > /dev/null || fail "$3: $1 and $2 differ"; }
"$build/make_shards" synthetic data --shape 12x12x3 --count 480 --classes 5 --shards 4 > /dev/null 2>&1
resnet=("$build/train_resnet" --data data -a resnet20 -b 8 --accum-steps 2 --steps 6 --lr 0.05 --threads 1
        --log-every 6 --checkpoint-every 3 --eval-every 6)
final=ckpt-step00000006.h5
pair() {  # NAME NP ARGS...: the run with and without --recompute, then their checkpoints and test figures
  local name=$1 np=$2; shift 2
  mpi "$np" "$@" --checkpoint-dir "$name" > "$name.log" 2>&1 || { cat "$name.log"; fail "$name"; }
  mpi "$np" "$@" --recompute --checkpoint-dir "${name}_r" > "${name}_r.log" 2>&1 || { cat "${name}_r.log"; fail "$name --recompute"; }
  grep -q "^recompute: [0-9]* of the model's [0-9]* blocks keep only their input" "${name}_r.log" ||
    { cat "${name}_r.log"; fail "$name: no recompute line"; }
  same "$name/$final" "${name}_r/$final" "$name with --recompute"
  [[ $(grep "^epoch .*: test" "$name.log") == $(grep "^epoch .*: test" "${name}_r.log") ]] ||
    fail "$name: evaluation differs"
}
pair one 1 "${resnet[@]}"
grep -q "^recompute: 10 of the model's 11 blocks" one_r.log || fail "ResNet-20: the stem and 9 residual blocks, the head plain"
pair syncbn 2 "${resnet[@]}" --sync-bn
pair zero 2 "${resnet[@]}" --zero 1
pair stages 2 "${resnet[@]}" --pipeline-stages 2
same one/$final stages_r/$final "2 stages with --recompute against 1 process"
custom=("$build/custom_model" --data data -b 8 --accum-steps 2 --steps 6 --threads 1 --log-every 6 --dropout 0.3
        --checkpoint-every 3)
pair custom 1 "${custom[@]}"
# A checkpoint of a recomputed run continues without it, bitwise.
mkdir -p cont && cp one_r/ckpt-step00000003.h5 cont/
mpi 1 "${resnet[@]}" --checkpoint-dir cont --resume auto > cont.log 2>&1 || { cat cont.log; fail "resumed"; }
grep -q "resumed from cont/ckpt-step00000003.h5: step 3" cont.log || { cat cont.log; fail "not resumed from step 3"; }
same one/$final cont/$final "a --recompute checkpoint continued without it"
if mpi 2 "${resnet[@]}" --pipeline-stages 2 --pipeline-recompute --recompute --checkpoint-dir both > both.log 2>&1; then
  fail "--recompute with --pipeline-recompute ran"
fi
grep -q -- "--recompute and --pipeline-recompute: choose one" both.log || { cat both.log; fail "no error naming both"; }
echo "recompute test: PASS"
