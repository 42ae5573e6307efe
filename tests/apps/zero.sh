#!/usr/bin/env bash
# zero.sh BUILD_DIR WORK_DIR: train_resnet --zero 1 (optimizer state sharded, comm/zero.h) is bitwise the
# unsharded training on 2 and 3 ranks with SGD+Nesterov and AdamW, weight decay and accumulation; a ZeRO
# checkpoint (canonical, unsharded) resumes exactly without ZeRO, an unsharded one with ZeRO, and a ZeRO
# checkpoint of 2 ranks on 1 rank with the global batch kept, exactly like the unsharded one does.
set -euo pipefail
build=$(cd "$1" && pwd); work=$2
rm -rf "$work"; mkdir -p "$work"; cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "zero test: FAIL: $*"; exit 1; }
"$build/make_shards" synthetic data --shape 12x12x3 --count 400 --classes 5 --shards 2 > /dev/null 2>&1
same() { "$build/tests/compare_checkpoints" "$1" "$2" > /dev/null || fail "$3: $1 and $2 differ"; }
ck4=ckpt-step00000004.h5; ck8=ckpt-step00000008.h5
for np in 2 3; do
  for opt in "--optimizer sgd --nesterov" "--optimizer adamw --lr 0.001"; do
    # shellcheck disable=SC2206
    common=(--data data -a resnet20 -b 4 --steps 8 --accum-steps 2 --log-every 100 --threads 1 --checkpoint-every 4 --wd 5e-4 $opt)
    run() { timeout -k 5 300 mpirun -np "$1" --oversubscribe "$build/train_resnet" "${common[@]}" "${@:2}" > run.log 2>&1 ||
              { cat run.log; fail "np $1 ${*:2}"; }; }
    run "$np" --checkpoint-dir p
    run "$np" --zero 1 --checkpoint-dir z
    same p/$ck8 z/$ck8 "np $np $opt: --zero 1 against the unsharded run"
    run "$np" --checkpoint-dir zp --resume z/$ck4
    same p/$ck8 zp/$ck8 "np $np $opt: a ZeRO checkpoint resumed without ZeRO"
    run "$np" --zero 1 --checkpoint-dir pz --resume p/$ck4
    same p/$ck8 pz/$ck8 "np $np $opt: an unsharded checkpoint resumed with ZeRO"
    if ((np == 2)); then  # another world size, the global batch kept: 1 rank x accum 4
      run 1 --accum-steps 4 --checkpoint-dir one-p --resume p/$ck4
      run 1 --accum-steps 4 --zero 1 --checkpoint-dir one-z --resume z/$ck4
      same one-p/$ck8 one-z/$ck8 "np 2 -> 1 $opt: the ZeRO checkpoint on another world size"
    fi
    echo "np $np $opt: ZeRO bitwise the unsharded training; checkpoints resume either way"
    rm -rf p z zp pz one-p one-z
  done
done
if timeout 60 "$build/train_resnet" --synthetic --zero 1 --precision fp16 --steps 1 > x.log 2>&1; then fail "fp16 accepted"; fi
grep -q -- "--zero 1 does not combine with --precision fp16 yet" x.log || fail "fp16: $(cat x.log)"
echo "zero test: PASS"
