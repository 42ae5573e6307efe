#!/usr/bin/env bash
# zero.sh BUILD_DIR WORK_DIR: train_resnet --zero 1 (optimizer state sharded, comm/zero.h) is bitwise the
# unsharded training on 2 and 3 ranks with SGD+Nesterov and AdamW, weight decay and accumulation; a ZeRO
# checkpoint (canonical, unsharded) resumes exactly without ZeRO, an unsharded one with ZeRO, and a ZeRO
# checkpoint of 2 ranks on 1 rank with the global batch kept, exactly like the unsharded one does; f16 loss
# scaling with gradient clipping is bitwise too, and the plan record reports the state per rank.
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
# f16 loss scaling and gradient clipping: the finite check and the norm combine over the shards. The plan
# record reports each rank's optimizer state (AdamW: 2 moments), the summary each rank's peak memory.
common=(--data data -a resnet20 -b 4 --steps 6 --log-every 100 --threads 1 --checkpoint-every 6 --optimizer adamw
        --lr 0.001 --precision fp16 --clip-grad-norm 0.2)
run() { timeout -k 5 300 mpirun -np "$1" --oversubscribe "$build/train_resnet" "${common[@]}" "${@:2}" > run.log 2>&1 ||
          { cat run.log; fail "np $1 ${*:2}"; }; }
run 2 --checkpoint-dir p --log-jsonl p.jsonl
run 2 --zero 1 --checkpoint-dir z --log-jsonl z.jsonl
same p/ckpt-step00000006.h5 z/ckpt-step00000006.h5 "np 2 fp16 + clipping: --zero 1 against the unsharded run"
python3 - p.jsonl z.jsonl <<'PY' || fail "the plan and summary records"
import json, sys
plain, zero = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
plan = lambda log: next(r for r in log if r["type"] == "plan")
summary = lambda log: next(r for r in log if r["type"] == "summary")
full, shards = plan(plain)["optimizer_state_bytes"], plan(zero)["optimizer_state_bytes"]
params = plan(plain)["params"]
assert plan(zero)["zero"] == 1 and plan(plain)["zero"] == 0
assert full == [8 * params] * 2, (full, params)
assert sum(shards) == 8 * params and max(shards) - min(shards) <= 8 * 64, shards
assert len(summary(zero)["peak_mem_bytes_by_rank"]) == 2, summary(zero)
norms = lambda log: [r["grad_norm"] for r in log if r["type"] == "train"]
assert norms(plain) and norms(plain) == norms(zero), (norms(plain), norms(zero))
assert norms(plain)[-1] > 0.2, "the test must clip"
print("optimizer state per rank:", full, "->", shards)
PY
echo "np 2 fp16 + clipping: ZeRO bitwise the unsharded training"
echo "zero test: PASS"
