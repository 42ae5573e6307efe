#!/usr/bin/env bash
# tests/apps/pipeline.sh BUILD_DIR WORK_DIR [CASE...]: --pipeline-stages through the apps, on this host.
#   exact      ResNet-20 on shard data (-b 8, --accum-steps 4, evaluation on): 2 stages and 4 stages, 1F1B and
#              GPipe, train bitwise like 1 process (checkpoints and test accuracy); the custom model too;
#              2 stages x 2 replicas equal 2 replicas without stages (the same per-replica batch); dropout
#              and --pipeline-recompute too
#   resume     a 2-stage checkpoint continued by 1 process, and a 1-process one by 4 stages: bitwise the
#              uninterrupted run
#   records    the plan record's split and per-stage costs, the train records' per-stage busy time and bubble
#   errors     a world the stages do not divide, a bad --pipeline-split: refused naming the flag
#   faults     kill -9 of a stage ends the job within seconds naming its rank; a stage stopped mid-step is
#              reported by the watchdog naming the stage and micro-batch
#   elastic    ringtrain_run: a lost host leaves 2 of 4 ranks: relaunched as 2 stages x 1 replica with
#              --accum-steps doubled; 1 of 2 ranks: relaunched without stages; both finish, bitwise the
#              run on the survivors alone
set -euo pipefail
build=$(cd "$1" && pwd); work=$2; shift 2
cases=("$@")
((${#cases[@]})) || cases=(exact resume records errors faults elastic)
rm -rf "$work"; mkdir -p "$work"; cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "pipeline test: FAIL: $*"; exit 1; }
mpi() { local np=$1; shift; timeout -k 5 300 mpirun -np "$np" "$@"; }
same() { "$build/tests/compare_checkpoints" "$1" "$2" > /dev/null || fail "$3: $1 and $2 differ"; }
"$build/make_shards" synthetic data --shape 12x12x3 --count 480 --classes 5 --shards 4 > /dev/null 2>&1
resnet=("$build/train_resnet" --data data -a resnet20 -b 8 --accum-steps 4 --steps 6 --lr 0.05 --threads 1
        --log-every 2 --checkpoint-every 3)
final=ckpt-step00000006.h5

for case in "${cases[@]}"; do
  case $case in
    exact)
      mpi 1 "${resnet[@]}" --checkpoint-dir one > one.log 2>&1 || { cat one.log; fail "1 process"; }
      for s in 2 4; do
        for sched in 1f1b gpipe; do
          mpi $s "${resnet[@]}" --pipeline-stages $s --pipeline-schedule $sched --checkpoint-dir p$s$sched \
            > p$s$sched.log 2>&1 || { cat p$s$sched.log; fail "$s stages $sched"; }
          same one/$final p$s$sched/$final "$s stages $sched"
          [[ $(grep "^epoch 1: test" one.log) == $(grep "^epoch 1: test" p$s$sched.log) ]] || fail "$s stages $sched: evaluation"
        done
      done
      grep -q "4 rank(s) on 1 node(s) (4 pipeline stages x 1 replica(s))" p41f1b.log || fail "the startup line"
      grep -q "batch 8/replica x 4 accum = 32 global" p41f1b.log || fail "the global batch"
      mpi 2 "${resnet[@]}" --checkpoint-dir two > two.log 2>&1 || { cat two.log; fail "2 replicas"; }
      mpi 4 "${resnet[@]}" --pipeline-stages 2 --checkpoint-dir twotwo > twotwo.log 2>&1 ||
        { cat twotwo.log; fail "2 stages x 2 replicas"; }
      # Two ranks' ring sums in one order only (a + b = b + a), so this holds bitwise too.
      same two/$final twotwo/$final "2 stages x 2 replicas against 2 replicas"
      # Recompute's block-by-block backward with the stage's gradient all-reduce running during it.
      mpi 4 "${resnet[@]}" --pipeline-stages 2 --pipeline-recompute --checkpoint-dir twotwor > twotwor.log 2>&1 ||
        { cat twotwor.log; fail "2 stages x 2 replicas recomputed"; }
      same two/$final twotwor/$final "2 stages x 2 replicas with --pipeline-recompute against 2 replicas"
      custom=("$build/custom_model" --data data -b 8 --accum-steps 2 --steps 5 --threads 1 --log-every 5)
      mpi 1 "${custom[@]}" --checkpoint-dir c1 > c1.log 2>&1 || { cat c1.log; fail "custom model, 1 process"; }
      mpi 2 "${custom[@]}" --pipeline-stages 2 --checkpoint-dir c2 > c2.log 2>&1 || { cat c2.log; fail "custom, 2 stages"; }
      same c1/ckpt-step00000005.h5 c2/ckpt-step00000005.h5 "the custom model in 2 stages"
      # Dropout in the last stage draws where one process draws (the generator's streams follow the blocks).
      mpi 1 "${custom[@]}" --dropout 0.3 --checkpoint-dir d1 > d1.log 2>&1 || { cat d1.log; fail "dropout, 1 process"; }
      mpi 2 "${custom[@]}" --dropout 0.3 --pipeline-stages 2 --pipeline-split 0,5 --checkpoint-dir d2 > d2.log 2>&1 ||
        { cat d2.log; fail "dropout, 2 stages"; }
      mpi 4 "${custom[@]}" --dropout 0.3 --pipeline-stages 4 --pipeline-recompute --checkpoint-dir d4 > d4.log 2>&1 ||
        { cat d4.log; fail "dropout, 4 stages recomputed"; }
      same d1/ckpt-step00000005.h5 d2/ckpt-step00000005.h5 "the custom model with dropout in 2 stages"
      same d1/ckpt-step00000005.h5 d4/ckpt-step00000005.h5 "the custom model with dropout in 4 stages, recomputed"
      mpi 4 "${resnet[@]}" --pipeline-stages 4 --pipeline-recompute --checkpoint-dir p4r > p4r.log 2>&1 ||
        { cat p4r.log; fail "4 stages recomputed"; }
      same one/$final p4r/$final "4 stages with --pipeline-recompute"
      echo "exact: 2 and 4 stages, 1F1B and GPipe, bitwise 1 process (ResNet-20 and the custom model); 2x2 = 2 replicas"
      ;;
    resume)
      [[ -f one/$final ]] || mpi 1 "${resnet[@]}" --checkpoint-dir one > one.log 2>&1
      mpi 2 "${resnet[@]}" --pipeline-stages 2 --checkpoint-dir staged > staged.log 2>&1 || { cat staged.log; fail "staged"; }
      mkdir -p half && cp staged/ckpt-step00000003.h5 half/
      mpi 1 "${resnet[@]}" --checkpoint-dir half --resume auto > rest1.log 2>&1 || { cat rest1.log; fail "resumed by 1"; }
      grep -q "resumed from half/ckpt-step00000003.h5: step 3" rest1.log || fail "resume: not from step 3"
      same one/$final half/$final "a 2-stage checkpoint continued by 1 process"
      mkdir -p four && cp one/ckpt-step00000003.h5 four/
      mpi 4 "${resnet[@]}" --pipeline-stages 4 --checkpoint-dir four --resume auto > rest4.log 2>&1 ||
        { cat rest4.log; fail "resumed by 4 stages"; }
      same one/$final four/$final "a 1-process checkpoint continued by 4 stages"
      # With dropout in a later stage the checkpoint's generator position is every stage's.
      custom=("$build/custom_model" --data data -b 8 --accum-steps 2 --steps 6 --threads 1 --log-every 6 --dropout 0.3
              --checkpoint-every 3)
      mpi 1 "${custom[@]}" --checkpoint-dir cd1 > cd1.log 2>&1 || { cat cd1.log; fail "custom, 1 process"; }
      mpi 2 "${custom[@]}" --pipeline-stages 2 --checkpoint-dir cd2 > cd2.log 2>&1 || { cat cd2.log; fail "custom, 2 stages"; }
      mkdir -p cdr && cp cd2/ckpt-step00000003.h5 cdr/
      mpi 1 "${custom[@]}" --checkpoint-dir cdr --resume auto > cdr.log 2>&1 || { cat cdr.log; fail "custom resumed"; }
      same cd1/ckpt-step00000006.h5 cdr/ckpt-step00000006.h5 "a 2-stage checkpoint of a model with dropout, resumed by 1"
      echo "resume: 2 stages -> 1 process and 1 process -> 4 stages, bitwise (dropout too)"
      ;;
    records)
      mpi 2 "${resnet[@]}" --pipeline-stages 2 --log-every 1 --log-jsonl r.jsonl --checkpoint-dir r > r.log 2>&1 ||
        { cat r.log; fail "records run"; }
      grep -Eq "^pipeline: 2 stages x 1 replica\(s\), 1f1b, 4 micro-batches per step, split 0,[0-9]+ \(time\)$" r.log ||
        { cat r.log; fail "the split line"; }
      grep -Eq "^  stage 1: [0-9]+ block\(s\) layer[0-9.]+\.\.head, .* of parameters, [0-9.]+ ms and .* of activations a micro-batch \(1 in flight\)$" r.log ||
        { cat r.log; fail "the stage lines"; }
      python3 - r.jsonl << 'PY' || fail "records"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
plan = next(x for x in r if x["type"] == "plan")["pipeline"]
assert plan["stages"] == 2 and plan["replicas"] == 1 and plan["schedule"] == "1f1b" and plan["micro_batches"] == 4, plan
assert abs(plan["ideal_bubble"] - 1 / 5) < 1e-12, plan
st = plan["stage"]
assert len(st) == 2 and st[0]["blocks"][0] == "stem" and st[1]["blocks"][-1] == "head", st
assert len(st[0]["blocks"]) + len(st[1]["blocks"]) == 11, st
assert st[0]["micro_batches_in_flight"] == 2 and st[1]["micro_batches_in_flight"] == 1, st
assert all(s["seconds"] > 0 and s["param_bytes"] > 0 and s["activation_bytes_per_micro_batch"] > 0 for s in st), st
train = [x for x in r if x["type"] == "train"]
assert len(train) == 6, len(train)
for t in train:
    assert len(t["busy_s"]) == 2 and all(b > 0 for b in t["busy_s"]), t
    assert len(t["bubble"]) == 2 and all(0 <= b < 1 for b in t["bubble"]), t
    assert len(t["activation_bytes"]) == 2 and all(a > 0 for a in t["activation_bytes"]), t
summary = next(x for x in r if x["type"] == "summary")
assert summary["train_loss"] > 0, summary
PY
      echo "records: the split with per-stage costs; per-stage busy time and bubble in every train record"
      ;;
    errors)
      if mpi 3 "${resnet[@]}" --checkpoint-dir e --pipeline-stages 2 > e1.log 2>&1; then fail "3 ranks, 2 stages accepted"; fi
      grep -q -- "--pipeline-stages 2 does not divide the 3 ranks: the world is stages x data-parallel replicas (run 2 x D ranks, e.g. 2 or 4)" e1.log ||
        { cat e1.log; fail "errors: no divisibility message"; }
      if mpi 2 "${resnet[@]}" --checkpoint-dir e --pipeline-stages 2 --pipeline-split 0,11 > e2.log 2>&1; then fail "a split past the end accepted"; fi
      grep -q -- "--pipeline-split '0,11': the model has 11 blocks (0 to 10), so stage 1 would hold none" e2.log ||
        { cat e2.log; fail "errors: no split message"; }
      if mpi 1 "${resnet[@]}" --checkpoint-dir e --pipeline-split 0,4 > e3.log 2>&1; then fail "a split without stages accepted"; fi
      grep -q -- "--pipeline-split 0,4 needs --pipeline-stages 2 or more" e3.log || { cat e3.log; fail "errors: split alone"; }
      echo "errors: refused naming the flag"
      ;;
    faults)
      long=("$build/train_resnet" --synthetic -a resnet20 -b 4 --image-size 8 --synthetic-size 100000 --accum-steps 4
            --steps 100000 --threads 1 --log-every 1)
      ( rc=0; mpi 4 "${long[@]}" --pipeline-stages 4 --timeout 60 > k.log 2>&1 || rc=$?; echo $rc > k.rc ) &
      for _ in $(seq 300); do grep -q "step 2/" k.log 2> /dev/null && break; sleep 0.1; done
      victim=""
      for p in $(pgrep -f "train_resnet --synthetic -a resnet20 -b 4 --image-size 8 --synthetic-size 100000"); do
        tr '\0' '\n' < /proc/$p/environ 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=2" && victim=$p
      done
      [[ -n $victim ]] || { cat k.log; fail "faults: no rank 2 to kill"; }
      start=$(date +%s.%N); kill -9 "$victim"
      for _ in $(seq 300); do [[ -f k.rc ]] && break; sleep 0.1; done
      took=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$start")
      [[ -f k.rc && $(cat k.rc) != 0 ]] || { cat k.log; fail "faults: the job did not end within 30 s of the kill"; }
      grep -q "process rank 2 .* exited on signal 9" k.log || { cat k.log; fail "faults: the killed rank is not named"; }
      echo "faults: a killed stage (rank 2 of 4 stages) ended the job in $took s, named"
      # A stage stopped (SIGSTOP, its watchdog with it) mid-step: its neighbour's watchdog names what it waits
      # for. RINGTRAIN_INJECT=stop:1:2 stops stage 1 after its first forward of the step after step 2, on every
      # run (a kill -STOP from here landed between steps as often as not beside a CPU hog).
      rm -f s.rc
      ( rc=0; RINGTRAIN_INJECT=stop:1:2 mpi 2 -x RINGTRAIN_INJECT "${long[@]}" --image-size 16 \
          --pipeline-stages 2 --timeout 3 > s.log 2>&1 || rc=$?; echo $rc > s.rc ) &
      for _ in $(seq 600); do [[ -f s.rc ]] && break; sleep 0.1; done
      pkill -9 -f "train_resnet --synthetic -a resnet20 -b 4 --image-size 8 --synthetic-size 100000" || true
      [[ -f s.rc ]] || { cat s.log; fail "faults: a stopped stage was not reported within 60 s"; }
      [[ $(cat s.rc) != 0 ]] || { cat s.log; fail "faults: the job with a stopped stage ended with status 0"; }
      grep -q "rank 1 stops itself (SIGSTOP) at step 2, after micro-batch 0's forward" s.log ||
        { cat s.log; fail "faults: the stop did not fire"; }
      grep -Eq "step 2 stuck in pipeline: waiting for a micro-batch's gradient \(stage 0, micro-batch [0-9]+, from stage 1 \(rank 1\)\)" s.log ||
        { cat s.log; fail "faults: the neighbour's report does not name the stage, micro-batch and the stopped rank"; }
      grep -E "stuck in" s.log | head -2
      echo "faults: a stopped stage reported by its neighbour naming the stage, micro-batch and rank"
      ;;
    elastic)
      cat > agent << 'EOF'
#!/usr/bin/env bash
while [[ ${1:-} == -* ]]; do shift; done
host=$1; shift
[[ $host = ghost ]] && { echo "ssh: connect to host ghost port 22: No route to host" >&2; exit 255; }
exec /bin/sh -c "$*"
EOF
      chmod +x agent
      sup() { timeout -k 5 300 "$build/ringtrain_run" "$@"; }
      printf 'localhost slots=2\nghost slots=2\n' > hosts4
      sup --hostfile hosts4 --np 4 --mpirun-args "--oversubscribe --mca plm_rsh_agent $PWD/agent" -- \
        "${resnet[@]}" --accum-steps 2 --pipeline-stages 2 --checkpoint-dir g > g.log 2>&1 || { cat g.log; fail "elastic: 4 -> 2"; }
      grep -q "relaunching 2 rank(s) on localhost (2) with --accum-steps 4 (same global batch)" g.log ||
        { cat g.log; fail "elastic: no 2-rank relaunch keeping the stages"; }
      grep -q "2 rank(s) on 1 node(s) (2 pipeline stages x 1 replica(s))" g.log || { cat g.log; fail "elastic: not 2 stages"; }
      [[ -f one/$final ]] || mpi 1 "${resnet[@]}" --checkpoint-dir one > one.log 2>&1
      same one/$final g/$final "elastic: 2 stages on the survivors"
      printf 'localhost slots=1\nghost slots=1\n' > hosts2
      sup --hostfile hosts2 --np 2 --mpirun-args "--mca plm_rsh_agent $PWD/agent" -- \
        "${resnet[@]}" --pipeline-stages 2 --checkpoint-dir h > h.log 2>&1 || { cat h.log; fail "elastic: 2 -> 1"; }
      grep -q "relaunching 1 rank(s) on localhost with --accum-steps 4 and --pipeline-stages 1 (too few ranks for 2 stages" h.log ||
        { cat h.log; fail "elastic: no relaunch without stages"; }
      same one/$final h/$final "elastic: 1 rank on the survivor"
      echo "elastic: 4 -> 2 ranks keeping 2 stages, 2 -> 1 rank without stages; both bitwise the survivors' run"
      ;;
    *) fail "unknown case $case" ;;
  esac
done
echo "pipeline test: PASS"
