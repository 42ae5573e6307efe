#!/usr/bin/env bash
# tests/apps/elastic.sh BUILD_DIR WORK_DIR: the elastic supervisor (ringtrain_run) on this host, no root
# needed (the node-loss case across emulated hosts is cluster.sh's "elastic" scenario):
#   retry       a rank that throws once (RINGTRAIN_INJECT=throw:1:5:0) is relaunched on the same host from
#               the newest checkpoint and ends bitwise equal to a run that never failed; one restart logged
#   checkpoint  kill -9 of the job while rank 0 writes a checkpoint: the previous one is used, the half
#               written file removed, and the run again ends bitwise equal to the uninterrupted one
#   corrupt     a corrupt data shard is not retried: non-zero exit at once, naming the file; nor are a
#               checkpoint of another model and a non-finite loss
#   exhausted   a failure on every launch: --max-restarts 1 gives up naming the last failure; with more
#               restarts the same error at the same step stops it after the second launch
#   lost host   a host that does not answer (a launch agent that fails for it, as ssh to a dead machine)
#               is dropped: 2 ranks become 1 with --accum-steps 2; --min-np 2 refuses, saying so; a global
#               batch that cannot be kept is refused unless --allow-batch-change
#   slurm       without --hostfile, the hosts of the Slurm allocation (a stand-in scontrol)
#   usage       no --checkpoint-dir, -np inside --mpirun-args: refused before anything runs
set -euo pipefail
build=$(cd "$1" && pwd); work=$2
rm -rf "$work"; mkdir -p "$work"; cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "elastic test: FAIL: $*"; exit 1; }
sup() { timeout -k 5 180 "$build/ringtrain_run" "$@"; }
"$build/make_shards" synthetic data --shape 12x12x3 --count 400 --classes 5 --shards 2 > /dev/null 2>&1
common=(--data data -a resnet20 -b 8 --steps 12 --log-every 4 --lr 0.05 --threads 1 --checkpoint-every 3)
records() { python3 -c "import json,sys; print(sum(json.loads(l)['type']==sys.argv[2] for l in open(sys.argv[1])))" "$@"; }

# The run every recovered one must equal.
timeout -k 5 120 mpirun -np 2 --oversubscribe "$build/train_resnet" "${common[@]}" --checkpoint-dir u > u.log 2>&1 ||
  { cat u.log; fail "the uninterrupted run"; }
final=ckpt-step00000012.h5

# ---- retry: a rank throws once
RINGTRAIN_INJECT=throw:1:5:0 sup --np 2 --mpirun-args "--oversubscribe -x RINGTRAIN_INJECT" -- \
  "$build/train_resnet" "${common[@]}" --checkpoint-dir a --log-jsonl a.jsonl > a.log 2>&1 || { cat a.log; fail "retry: exit non-zero"; }
cat a.log | grep "ringtrain_run:"
grep -q "restart 1 of 3: rank 1 ([^)]*): injected failure at step 5; relaunching 2 rank(s)" a.log || fail "retry: no restart line"
grep -q "resumed at step 3 from a/ckpt-step00000003.h5" a.log || fail "retry: not resumed from step 3"
grep -q "finished after 1 restart(s); time lost" a.log || fail "retry: no summary"
grep -q "ringtrain-event" a.log && fail "retry: event lines were echoed"
[[ $(records a.jsonl restart) = 1 && $(records a.jsonl recovered) = 1 ]] || fail "retry: the log has not one restart"
python3 - a.jsonl << 'PY' || fail "retry: restart record"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
restart = next(x for x in r if x["type"] == "restart")
assert restart["hosts_dropped"] == [] and restart["world_size"] == 2 and restart["accum_steps"] == 1, restart
assert restart["resume_step"] == 3 and restart["last_step"] == 4 and restart["lost_steps"] == 1, restart
assert "injected failure at step 5" in restart["failure"], restart
end = r[-1]
assert end["type"] == "supervisor" and end["outcome"] == "finished" and end["restarts"] == 1 and end["time_lost_s"] > 0, end
PY
"$build/tests/compare_checkpoints" u/$final a/$final || fail "retry: the recovered run differs from the uninterrupted one"
echo "retry: relaunched once, bitwise equal to the run that never failed"

# ---- checkpoint: kill -9 during the write of step 6's checkpoint
( RINGTRAIN_INJECT=hang-checkpoint:0:6:0 sup --np 2 --mpirun-args "--oversubscribe -x RINGTRAIN_INJECT" -- \
    "$build/train_resnet" "${common[@]}" --checkpoint-dir k > k.log 2>&1; echo $? > k.rc ) &
for _ in $(seq 600); do compgen -G "k/.ckpt-step00000006.h5.tmp-*" > /dev/null && break; sleep 0.1; done
compgen -G "k/.ckpt-step00000006.h5.tmp-*" > /dev/null || { cat k.log; fail "checkpoint: the write never started"; }
grep -q "injected hang inside the write of the step-6 checkpoint" k.log || sleep 1
pkill -9 -f "^$build/train_resnet .*--checkpoint-dir k( |$)" || fail "checkpoint: nothing to kill"
wait
[[ $(cat k.rc) = 0 ]] || { cat k.log; fail "checkpoint: exit $(cat k.rc)"; }
grep -q "removed '.*\.ckpt-step00000006\.h5\.tmp-" k.log || fail "checkpoint: the half-written file was not removed"
grep -q "resumed at step 3 from k/ckpt-step00000003.h5" k.log || { cat k.log; fail "checkpoint: not resumed from step 3"; }
"$build/tests/compare_checkpoints" u/$final k/$final || fail "checkpoint: the recovered run differs"
echo "checkpoint: killed mid-write, resumed from the previous checkpoint, bitwise equal"

# ---- resume-path: a job started from --resume PATH that fails before its own first checkpoint is relaunched
# from that PATH (not --resume auto on its still-empty folder, which would train from random weights), and
# once it has written one, from that; both end bitwise equal to the run that never failed.
for fault in 7 10; do
  RINGTRAIN_INJECT=throw:1:$fault:0 sup --np 2 --mpirun-args "--oversubscribe -x RINGTRAIN_INJECT" -- \
    "$build/train_resnet" "${common[@]}" --resume u/ckpt-step00000006.h5 --checkpoint-dir p$fault > p$fault.log 2>&1 ||
    { cat p$fault.log; fail "resume-path: exit non-zero (fault at step $fault)"; }
  want="resuming step 6 from u/ckpt-step00000006.h5"
  (( fault == 10 )) && want="resuming step 9 from p$fault/ckpt-step00000009.h5"
  grep -q "$want" p$fault.log || { cat p$fault.log; fail "resume-path: the relaunch did not announce '$want'"; }
  grep -q "restart 1 is training again: resumed at step $(( fault == 10 ? 9 : 6 ))" p$fault.log ||
    { cat p$fault.log; fail "resume-path: not resumed where announced"; }
  "$build/tests/compare_checkpoints" u/$final p$fault/$final ||
    fail "resume-path: the relaunched run (fault at step $fault) differs from the run that never failed"
done
echo "resume-path: relaunched from the command's --resume PATH, then from its own checkpoint, bitwise equal"

# ---- corrupt: bad data is not retried
cp -r data bad
printf 'garbage' | dd of=bad/train-00001-of-00002.h5 bs=1 seek=4000 conv=notrunc 2> /dev/null
start=$(date +%s)
if sup --np 2 --mpirun-args --oversubscribe -- "$build/train_resnet" "${common[@]}" --data bad --checkpoint-dir c > c.log 2>&1; then
  fail "corrupt: exit 0"
fi
grep -q "ringtrain_run: not restarting: rank [01] ([^)]*): .*train-00001-of-00002.h5.*a restart cannot fix this error" c.log ||
  { cat c.log; fail "corrupt: no refusal naming the shard"; }
grep -q "restart 1" c.log && fail "corrupt: it was retried"
echo "corrupt: not retried, the shard named, $(($(date +%s) - start)) s"

# ---- more errors no restart fixes: a checkpoint of another model, a diverged run
if sup --np 2 --mpirun-args --oversubscribe -- "$build/train_resnet" "${common[@]}" -a resnet32 --checkpoint-dir u \
     --resume auto > w.log 2>&1; then fail "wrong model: exit 0"; fi
grep -q "not restarting: rank [01] ([^)]*): --resume u/ckpt-step00000012.h5: the checkpoint was written with -a/--arch \"resnet20\" but this run has \"resnet32\"" w.log ||
  { cat w.log; fail "wrong model: no refusal"; }
if sup --np 2 --mpirun-args --oversubscribe -- "$build/train_resnet" "${common[@]}" --lr 1e30 --checkpoint-dir d > d.log 2>&1; then
  fail "diverged: exit 0"
fi
grep -q "not restarting: rank [01] ([^)]*): non-finite loss" d.log || { cat d.log; fail "diverged: no refusal"; }
for log in w d; do grep -q "restart 1" $log.log && fail "$log: it was retried"; done
echo "permanent: a checkpoint of another model and a non-finite loss are not retried"

# ---- exhausted
if RINGTRAIN_INJECT=throw:1:2 sup --np 2 --max-restarts 1 --mpirun-args "--oversubscribe -x RINGTRAIN_INJECT" -- \
     "$build/train_resnet" "${common[@]}" --checkpoint-dir e > e.log 2>&1; then fail "exhausted: exit 0"; fi
grep -q "giving up: --max-restarts 1 used; the last failure: rank 1 ([^)]*): injected failure at step 2" e.log ||
  { cat e.log; fail "exhausted: no message"; }
[[ $(grep -c "^train_resnet: resnet20" e.log) = 2 ]] || fail "exhausted: not 2 launches"
if RINGTRAIN_INJECT=throw:1:2 sup --np 2 --max-restarts 5 --mpirun-args "--oversubscribe -x RINGTRAIN_INJECT" -- \
     "$build/train_resnet" "${common[@]}" --checkpoint-dir r > r.log 2>&1; then fail "repeated: exit 0"; fi
grep -q "not restarting: the same error came back at step 1 after a restart" r.log || { cat r.log; fail "repeated: no message"; }
[[ $(grep -c "^train_resnet: resnet20" r.log) = 2 ]] || fail "repeated: not 2 launches"
echo "exhausted: gave up naming the last failure; a repeating error stops after 2 launches"

# ---- lost host: 'ghost' does not answer its launch agent (as ssh to a dead machine)
cat > agent << 'EOF'
#!/usr/bin/env bash
while [[ ${1:-} == -* ]]; do shift; done
host=$1; shift
[[ $host = ghost ]] && { echo "ssh: connect to host ghost port 22: No route to host" >&2; exit 255; }
exec /bin/sh -c "$*"
EOF
chmod +x agent
printf 'localhost slots=1\nghost slots=1\n' > hosts2
sup --hostfile hosts2 --np 2 --mpirun-args "--mca plm_rsh_agent $PWD/agent" -- \
  "$build/train_resnet" "${common[@]}" --checkpoint-dir g --log-jsonl g.jsonl > g.log 2>&1 || { cat g.log; fail "lost host: exit non-zero"; }
grep -q "restart 1 of 3: host(s) lost: ghost.*dropped ghost; relaunching 1 rank(s) on localhost with --accum-steps 2 (same global batch)" g.log ||
  { cat g.log; fail "lost host: no restart line"; }
grep -q "batch 8/rank x 2 accum = 16 global" g.log || fail "lost host: the relaunch did not keep the global batch"
python3 -c "
import json, sys
r = [json.loads(l) for l in open('g.jsonl') if json.loads(l)['type'] == 'restart']
assert len(r) == 1 and r[0]['hosts_dropped'] == ['ghost'] and r[0]['world_size'] == 1 and r[0]['accum_steps'] == 2, r" ||
  fail "lost host: restart record"
if sup --hostfile hosts2 --np 2 --min-np 2 --mpirun-args "--mca plm_rsh_agent $PWD/agent" -- \
     "$build/train_resnet" "${common[@]}" --checkpoint-dir m > m.log 2>&1; then fail "min-np: exit 0"; fi
grep -q "cannot restart after: host(s) lost: ghost.*only 1 rank slot(s) are left on the hosts that answer, fewer than --min-np 2" m.log ||
  { cat m.log; fail "min-np: no message"; }
printf 'localhost slots=2\nghost slots=1\n' > hosts3
if sup --hostfile hosts3 --np 3 --min-np 2 --mpirun-args "--oversubscribe --mca plm_rsh_agent $PWD/agent" -- \
     "$build/train_resnet" "${common[@]}" --checkpoint-dir n > n.log 2>&1; then fail "batch: exit 0"; fi
grep -q "the global batch (3 ranks x --accum-steps 1 = 3 per-rank batches) cannot be kept on 2 to 2 ranks" n.log ||
  { cat n.log; fail "batch: no refusal"; }
sup --hostfile hosts3 --np 3 --min-np 2 --allow-batch-change --mpirun-args "--oversubscribe --mca plm_rsh_agent $PWD/agent" -- \
  "$build/train_resnet" "${common[@]}" --checkpoint-dir o > o.log 2>&1 || { cat o.log; fail "batch change: exit non-zero"; }
grep -q "relaunching 2 rank(s) on localhost (2) with --accum-steps 2 (the global batch CHANGES" o.log || { cat o.log; fail "batch change"; }
echo "lost host: dropped, same global batch on 1 rank; --min-np and an unkeepable global batch refused"

# ---- Slurm: without --hostfile the hosts are the allocation's (a stand-in scontrol names this host)
mkdir -p bin
printf '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && [ "$3" = "fake[1]" ] && echo localhost\n' > bin/scontrol
chmod +x bin/scontrol
PATH="$PWD/bin:$PATH" SLURM_JOB_NODELIST='fake[1]' SLURM_NTASKS_PER_NODE=2 sup --np 2 --mpirun-args --oversubscribe -- \
  "$build/train_resnet" "${common[@]}" --checkpoint-dir s > s.log 2>&1 || { cat s.log; fail "slurm: exit non-zero"; }
grep -q "launching 2 rank(s) on localhost (2) (from the Slurm allocation (fake\[1\]))" s.log || { cat s.log; fail "slurm hosts"; }
echo "slurm: the allocation's hosts"

# ---- usage
if sup --np 2 -- "$build/train_resnet" --synthetic > x.log 2>&1; then fail "usage: no --checkpoint-dir accepted"; fi
grep -q "the training command has no --checkpoint-dir" x.log || fail "usage: $(cat x.log)"
if sup --np 2 --mpirun-args "-np 4" -- "$build/train_resnet" --synthetic --checkpoint-dir z > x.log 2>&1; then fail "usage: -np"; fi
grep -q -- "--mpirun-args: -np is ringtrain_run's to set" x.log || fail "usage: $(cat x.log)"
echo "elastic test: PASS"
