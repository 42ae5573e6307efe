#!/usr/bin/env bash
# tests/apps/cluster.sh SCENARIO SOURCE_DIR BUILD_DIR: multi-node behaviour through the emulated cluster
# (scripts/cluster.sh). Each scenario brings up its own cluster (prefix rtt, 10.213.8.0/24, never a cluster a
# user has up), runs, and tears it down whatever happens. Exit 77 (CTest: skipped, with the reason printed)
# where network namespaces cannot be made (not root, no iproute2).
#   harness      the script's verbs, its errors, and that the machine's own namespace is left unchanged
#   collectives  test_comm on 2 nodes x 2 ranks over TCP: World (local ranks, host names), the hierarchical
#                all-reduce, every collective exact
#   training     test_grad_sync and test_sync_batchnorm on 2x2: N ranks equal 1 process on the union batch
#   doctor       ringtrain_env across 2x2: the rank -> host map, every all-reduce check passes
#   resnet       train_resnet on 2x2: the flat ring gives the same bits as on one host (with and without
#                --sync-bn); auto picks hierarchical and agrees with it to float noise
#   pipeline     train_resnet with 2 and 4 pipeline stages (1F1B and GPipe) on 2x2, stages on both nodes: the
#                same bits as on one host, no hang
#   layout       --layout auto on 2x2: it measures the link between the hosts and what its transport takes from
#                the cores (the plan record's link), trains bitwise like its chosen flags given by hand across
#                the nodes; ringtrain_plan --save-link there writes a file another plan reads
#   bench        scripts/bench_cluster.py, briefly: its all-reduce table (ring within the link rate, gloo beside)
#   kill         cluster.sh kill node1 mid-training: non-zero exit within 30 s naming node1
#   partition    cluster.sh partition node1 mid-training: non-zero exit within --timeout + 30 s naming node1's
#                ranks (the watchdog) or node1 (mpirun) with the startup map of ranks by host, also beside a
#                CPU hog
#   elastic      ringtrain_run on 2 nodes x 1 rank, node1 killed mid-epoch: the run finishes on node0 alone
#                with --accum-steps 2 (the same global batch), bitwise equal to a node0-alone run resumed
#                from the same checkpoint, one restart logged, recovery under 60 s; a second run grows
#                back to 2 ranks when node1 is revived before its next failure
#   slurm_sbatch     real Slurm on 2 nodes (cluster.sh up 2 --slurm): sbatch --wait scripts/slurm/train_resnet.sbatch
#                    (ringtrain_run in the allocation, its hosts from scontrol) trains on both nodes
#   slurm_node_loss  the same job with node1 killed mid-training: Slurm marks node1 down, the job finishes on
#                    node0 alone with --accum-steps 2 (the global batch kept), one restart
#   slurm_scancel    scancel mid-training: the job ends CANCELLED with exit 143, the supervisor says it was
#                    stopped by SIGTERM and does not restart, the checkpoints stay and resume
#   slurm_requeue    scontrol requeue mid-training: the job runs again (restart 1) and resumes from its newest
#                    checkpoint, to the end
set -uo pipefail
scenario=${1:?scenario}
src=$(cd "${2:?source dir}" && pwd)
build=$(cd "${3:?build dir}" && pwd)
export RT_CLUSTER_PREFIX=rtt RT_CLUSTER_NET=10.213.8 RT_CLUSTER_STATE=/run/ringtrain-cluster-test
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cluster=$src/scripts/cluster.sh
work=$(mktemp -d)
fail() {
  echo "cluster test $scenario: FAIL: $*"
  # A Slurm scenario's daemons say why a job ended as it did: their logs go with the failure.
  local log
  for log in "$RT_CLUSTER_STATE"/slurm/slurmctld.log "$RT_CLUSTER_STATE"/slurm/slurmd-node*.log; do
    [[ -f $log ]] && { echo "--- last lines of $log"; tail -n 60 "$log"; }
  done
  exit 1
}
since() { python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$1"; }  # s since $(date +%s.%N)
cleanup() { "$cluster" down > /dev/null 2>&1; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ $(id -u) != 0 ]]; then echo "SKIP: the emulated cluster needs root (network namespaces)"; exit 77; fi
for tool in ip tc bridge unshare; do
  command -v "$tool" > /dev/null || { echo "SKIP: the emulated cluster needs '$tool' (iproute2, util-linux)"; exit 77; }
done
# What the cluster needs, tried on a throwaway namespace: a skip names the first thing this machine lacks.
probe() {
  ip netns add rtt-probe 2> /dev/null || { echo "cannot make network namespaces (ip netns add failed)"; return 1; }
  ip netns exec rtt-probe unshare --uts -- hostname probe 2> /dev/null ||
    { echo "cannot give a namespace its own host name (unshare --uts failed)"; return 1; }
  ip -n rtt-probe link add p0 type veth peer name p1 2> /dev/null || { echo "cannot make veth pairs"; return 1; }
  ip netns exec rtt-probe tc qdisc add dev p0 root tbf rate 1gbit burst 131072 latency 100ms 2> /dev/null ||
    { echo "cannot shape links (tc tbf failed)"; return 1; }
}
if ! reason=$(probe); then ip netns del rtt-probe 2> /dev/null; echo "SKIP: $reason"; exit 77; fi
ip netns del rtt-probe

"$cluster" down > /dev/null 2>&1  # what a killed earlier run may have left
up() { "$cluster" up "$@" || fail "cluster.sh up $* failed"; }
run() { timeout -k 5 "$1" "$cluster" run "${@:2}"; }

# Starts a long training job in the background (output in $work/job.log), waits until it has made steps.
start_training() {
  local extra=("$@")
  rm -f "$work/job.log" "$work/job.rc"
  ( start=$(date +%s.%N)
    timeout -k 5 240 "$cluster" run -np 4 -- "$build/train_resnet" --synthetic -a resnet20 -b 8 --image-size 16 \
      --threads 1 --steps 100000 --log-every 2 "${extra[@]}" > "$work/job.log" 2>&1
    echo "exit=$? after=$(since "$start")" > "$work/job.rc"
  ) &
  job=$!
  for _ in $(seq 600); do
    grep -q "step 6/" "$work/job.log" 2> /dev/null && return 0
    [[ -f $work/job.rc ]] && { cat "$work/job.log"; fail "the job ended before training ($(cat "$work/job.rc"))"; }
    sleep 0.1
  done
  cat "$work/job.log"
  fail "the job made no steps in 60 s"
}

# Waits for the background job; prints its output and how it ended.
job_result() {
  local t0=$1
  wait "$job"
  elapsed=$(since "$t0")
  cat "$work/job.log"
  read -r rc_line < "$work/job.rc"
  echo "job: $rc_line; ${elapsed}s from the fault to the end of mpirun"
  rc=${rc_line#exit=}
  rc=${rc%% *}
}

case $scenario in
  harness)
    before=$(ip -o link show; ip -o addr show; ip route show)
    "$cluster" up 0 2> "$work/err" && fail "up 0 was accepted"
    grep -q "N must be a number of nodes from 1 to" "$work/err" || fail "up 0: $(cat "$work/err")"
    "$cluster" up 2 --rate fast 2> "$work/err" && fail "--rate fast was accepted"
    grep -q "is not a tc rate" "$work/err" || fail "--rate fast: $(cat "$work/err")"
    "$cluster" up 2 --slots 0 2> "$work/err" && fail "--slots 0 was accepted"
    if "$cluster" up 2 --delay 50us > /dev/null 2> "$work/err"; then
      "$cluster" down > /dev/null  # a kernel with netem: the delay is honoured
    else
      grep -q "needs tc's netem qdisc" "$work/err" || fail "--delay: $(cat "$work/err")"
      grep -q "^rtt-" <<< "$(ip netns list)" && fail "a failed up left namespaces: $(ip netns list)"
      [[ -e $RT_CLUSTER_STATE ]] && fail "a failed up left its state folder"
    fi
    "$cluster" mpirun-args 2> "$work/err" && fail "mpirun-args without a cluster"
    grep -q "no cluster is up" "$work/err" || fail "mpirun-args: $(cat "$work/err")"
    up 3 --rate 2gbit --slots 2
    "$cluster" up 2 2> "$work/err" && fail "a second up was accepted"
    grep -q "a cluster is already up (3 nodes)" "$work/err" || fail "second up: $(cat "$work/err")"
    [[ $("$cluster" exec node2 hostname) = node2 ]] || fail "node2's host name is '$("$cluster" exec node2 hostname)'"
    grep -q "10.213.8.3/24" <<< "$("$cluster" exec node2 ip -o -4 addr show dev eth0)" || fail "node2 has not 10.213.8.3"
    grep -q "10.213.8.2" <<< "$("$cluster" exec node0 getent hosts node1)" || fail "node0 does not resolve node1"
    grep -q "tbf.*rate 2Gbit" <<< "$(ip netns exec rtt-switch tc qdisc show dev sw1)" || fail "sw1 is not shaped to 2gbit"
    grep -q "tbf.*rate 2Gbit" <<< "$("$cluster" exec node1 tc qdisc show dev eth0)" || fail "node1's eth0 is not shaped"
    grep -qx "node1 slots=2" "$RT_CLUSTER_STATE/hostfile" || fail "hostfile: $(cat "$RT_CLUSTER_STATE/hostfile")"
    grep -q -- "--hostfile $RT_CLUSTER_STATE/hostfile --mca plm_rsh_agent" <<< "$("$cluster" mpirun-args)" || fail "mpirun-args"
    "$cluster" exec node7 true 2> "$work/err" && fail "exec on node7 of 3 was accepted"
    grep -q "unknown node 'node7': the cluster that is up has node0..node2" "$work/err" || fail "node7: $(cat "$work/err")"
    [[ $(run 60 -np 3 --map-by node -- hostname | sort | tr '\n' ' ') = "node0 node1 node2 " ]] || fail "run: one rank per node"
    grep -q "node1: partitioned" <<< "$("$cluster" partition node1)" || fail "partition"
    grep -q "node1 10.213.8.2 partitioned" <<< "$("$cluster" status)" || fail "status after partition: $("$cluster" status)"
    # Packets to a partitioned node vanish: a connection attempt times out (no reset, no refusal).
    "$cluster" exec node0 timeout 10 python3 -c "
import socket, sys
try: socket.create_connection(('10.213.8.2', 9), timeout=2)
except socket.timeout: sys.exit(0)
except OSError as e: sys.exit(f'refused or reset instead of silence: {e}')
sys.exit('connected')" || fail "a partitioned node answered"
    "$cluster" heal node1 > /dev/null
    grep -q "node1 10.213.8.2 up" <<< "$("$cluster" status)" || fail "status after heal: $("$cluster" status)"
    "$cluster" exec node1 sleep 600 &
    sleep 0.5
    grep -q "every process killed" <<< "$("$cluster" kill node1)" || fail "kill"
    wait $! 2> /dev/null
    [[ $(ip netns pids rtt-node1 | wc -l) = 0 ]] || fail "processes survived kill node1"
    # A killed node stays down (as ssh to a dead machine, nothing enters it) until revived.
    "$cluster" exec node1 true 2> "$work/err" && fail "exec entered a killed node"
    grep -q "node1 is down" "$work/err" || fail "exec on a down node: $(cat "$work/err")"
    grep -q "node1 10.213.8.2 down" <<< "$("$cluster" status)" || fail "status after kill: $("$cluster" status)"
    "$cluster" revive node1 > /dev/null && "$cluster" exec node1 true || fail "revive"
    "$cluster" revive node1 2> /dev/null && fail "revive of a node that is up was accepted"
    # The launch agent (mpirun's ssh) does not get through a partition; exec from outside still does.
    "$cluster" partition node1 > /dev/null
    "$cluster" exec node0 "$RT_CLUSTER_STATE/agent" node1 true 2> "$work/err" && fail "the agent crossed a partition"
    grep -q "Connection timed out" "$work/err" || fail "agent across a partition: $(cat "$work/err")"
    "$cluster" heal node1 > /dev/null
    "$cluster" exec node0 "$RT_CLUSTER_STATE/agent" node1 true || fail "the agent after heal"
    "$cluster" down > /dev/null
    "$cluster" down > /dev/null || fail "a second down failed (must be idempotent)"
    grep -q "^rtt-" <<< "$(ip netns list)" && fail "namespaces left after down: $(ip netns list)"
    [[ -e $RT_CLUSTER_STATE || -e /etc/netns/rtt-node0 ]] && fail "state left after down"
    after=$(ip -o link show; ip -o addr show; ip route show)
    [[ $before = "$after" ]] || fail "the machine's own namespace changed: $(diff <(echo "$before") <(echo "$after"))"
    echo "harness: verbs, errors and teardown as documented; the machine's own links, addresses and routes unchanged"
    ;;
  collectives)
    up 2 --slots 2
    run 300 -np 4 -x RT_EXPECT_NODES=2x2 -- "$build/tests/test_comm" || fail "test_comm on 2 nodes x 2 ranks"
    run 300 -np 2 -x RT_EXPECT_NODES=2x1 --map-by node -- "$build/tests/test_comm" || fail "test_comm on 2 nodes x 1 rank"
    ;;
  training)
    up 2 --slots 2
    run 400 -np 4 -- "$build/tests/test_grad_sync" || fail "test_grad_sync on 2 nodes x 2 ranks"
    run 400 -np 4 -- "$build/tests/test_sync_batchnorm" || fail "test_sync_batchnorm on 2 nodes x 2 ranks"
    ;;
  doctor)
    up 2 --slots 2
    run 120 -np 4 -- "$build/ringtrain_env" > "$work/out" 2>&1 || { cat "$work/out"; fail "ringtrain_env across 2 nodes"; }
    cat "$work/out"
    for want in "rank 0: node0" "rank 1: node0" "rank 2: node1" "rank 3: node1" "host node1:" \
                "PASS ring all-reduce" "PASS hierarchical all-reduce" "PASS mpi all-reduce" "all checks passed"; do
      grep -q "$want" "$work/out" || fail "ringtrain_env printed no '$want'"
    done
    ;;
  resnet)
    # A checkpoint every step: the hierarchical ring sums in another order than the flat ring, and ResNet
    # training amplifies that rounding step by step (0.2% after 6 steps on some CPUs), so the two are held
    # to float noise after one step; the flat ring over TCP is held bitwise to the end.
    args=(--synthetic -a resnet20 -b 4 --image-size 8 --synthetic-size 64 --steps 6 --threads 1 --log-every 100 --seed 3
          --checkpoint-every 1)
    for bn in "" --sync-bn; do
      timeout -k 5 300 mpirun -np 4 --allow-run-as-root --oversubscribe "$build/train_resnet" "${args[@]}" --backend ring \
        $bn --checkpoint-dir "$work/one$bn" > "$work/one.log" 2>&1 || { cat "$work/one.log"; fail "4 ranks on one host $bn"; }
    done
    up 2 --slots 2
    run 300 -np 4 -- "$build/train_resnet" "${args[@]}" --backend ring --checkpoint-dir "$work/ring" > "$work/ring.log" 2>&1 ||
      { cat "$work/ring.log"; fail "2x2 ring"; }
    run 300 -np 4 -- "$build/train_resnet" "${args[@]}" --checkpoint-dir "$work/auto" > "$work/auto.log" 2>&1 ||
      { cat "$work/auto.log"; fail "2x2 auto"; }
    run 300 -np 4 -- "$build/train_resnet" "${args[@]}" --backend ring --sync-bn --checkpoint-dir "$work/ring-bn" \
      > "$work/ring-bn.log" 2>&1 || { cat "$work/ring-bn.log"; fail "2x2 ring with --sync-bn"; }
    head -1 "$work/ring.log" "$work/auto.log"
    grep -q "4 rank(s) on 2 node(s), ring backend" "$work/ring.log" || fail "the ring run's plan line"
    grep -q "4 rank(s) on 2 node(s), hierarchical backend" "$work/auto.log" || fail "--backend auto did not pick hierarchical on 2x2"
    ck=ckpt-step00000006.h5
    "$build/tests/compare_checkpoints" "$work/one/$ck" "$work/ring/$ck" || fail "the ring over TCP is not bitwise the ring on one host"
    "$build/tests/compare_checkpoints" "$work/one--sync-bn/$ck" "$work/ring-bn/$ck" ||
      fail "SyncBatchNorm over TCP is not bitwise SyncBatchNorm on one host"
    "$build/tests/compare_checkpoints" "$work/one/ckpt-step00000001.h5" "$work/auto/ckpt-step00000001.h5" --rtol 1e-4 ||
      fail "one step of hierarchical across nodes is not the one-host step to float noise"
    ;;
  pipeline)
    # Stages on both nodes (stage-major ranks: 2 stages x 2 replicas puts stage 0 on node0 and stage 1 on
    # node1; 4 stages put stages 0-1 on node0 and 2-3 on node1): activations and gradients cross the link in
    # pieces below the TCP eager limit, each stage's all-reduce stays inside its node. The same bits as on
    # one host (the same ops in the same order), and no hang.
    args=(--synthetic -a resnet20 -b 8 --image-size 16 --synthetic-size 256 --steps 4 --accum-steps 4 --threads 1
          --log-every 100 --seed 5)
    for s in 2 4; do
      split=(); [[ $s = 4 ]] && split=(--pipeline-split 0,4,7,9)
      timeout -k 5 300 mpirun -np 4 --allow-run-as-root --oversubscribe "$build/train_resnet" "${args[@]}" \
        "${split[@]}" --pipeline-stages $s --checkpoint-dir "$work/one$s" > "$work/one$s.log" 2>&1 ||
        { cat "$work/one$s.log"; fail "$s stages on one host"; }
    done
    up 2 --slots 2 --rate 1gbit
    for s in 2 4; do
      split=(); [[ $s = 4 ]] && split=(--pipeline-split 0,4,7,9)
      for sched in 1f1b gpipe; do
        start=$(date +%s.%N)
        run 300 -np 4 -- "$build/train_resnet" "${args[@]}" "${split[@]}" --pipeline-stages $s \
          --pipeline-schedule $sched --checkpoint-dir "$work/two$s$sched" > "$work/two$s$sched.log" 2>&1 ||
          { cat "$work/two$s$sched.log"; fail "$s stages ($sched) across 2 nodes"; }
        echo "$s stages, $sched, across 2 nodes: $(since "$start") s"
        "$build/tests/compare_checkpoints" "$work/one$s/ckpt-step00000004.h5" "$work/two$s$sched/ckpt-step00000004.h5" ||
          fail "$s stages ($sched) across nodes differ from one host"
      done
    done
    grep -q "4 rank(s) on 2 node(s) (2 pipeline stages x 2 replica(s))" "$work/two21f1b.log" ||
      { head -5 "$work/two21f1b.log"; fail "the 2x2 plan line"; }
    grep -q "4 rank(s) on 2 node(s) (4 pipeline stages x 1 replica(s))" "$work/two4gpipe.log" || fail "the 4-stage plan line"
    ;;
  layout)
    base=(--synthetic -a resnet20 --image-size 16 --synthetic-size 256 --steps 3 --threads 1 --log-every 100 --seed 7)
    args=("${base[@]}" --global-batch 32)
    up 2 --slots 2 --rate 1gbit
    run 300 -np 4 -- "$build/train_resnet" "${args[@]}" --layout auto --checkpoint-dir "$work/auto" \
      --log-jsonl "$work/auto.jsonl" > "$work/auto.log" 2>&1 || { cat "$work/auto.log"; fail "--layout auto on 2x2"; }
    grep -q "over 4 rank(s) on 2 host(s)" "$work/auto.log" || { cat "$work/auto.log"; fail "the table's world"; }
    # The plan record's link: measured between the 2 hosts, with what the transport takes from the cores beside
    # compute (a number from 0 to 8: on this machine's shared cores usually above 0, a quiet moment may read 0).
    chosen=$(python3 - "$work/auto.jsonl" << 'PY'
import json, sys
lay = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "plan"][-1]["layout"]
link = lay["link"]
assert "(2 host(s), 2 rank(s) each); the transport beside compute: " in link["source"], link
share = link["inter_cpu_per_wire"]
assert isinstance(share, (int, float)) and 0 <= share <= 8, link
print(lay["chosen"]["flags"])
PY
) || fail "the plan record's link"
    echo "--layout auto on 2x2 chose: $chosen"
    read -ra flags <<< "$chosen"
    run 300 -np 4 -- "$build/train_resnet" "${base[@]}" "${flags[@]}" --checkpoint-dir "$work/hand" \
      > "$work/hand.log" 2>&1 || { cat "$work/hand.log"; fail "the chosen flags by hand on 2x2"; }
    "$build/tests/compare_checkpoints" "$work/auto/ckpt-step00000003.h5" "$work/hand/ckpt-step00000003.h5" ||
      fail "--layout auto across nodes is not bitwise its flags by hand ($chosen)"
    run 300 -np 4 -- "$build/ringtrain_plan" "${args[@]}" --save-link "$work/link.json" > "$work/plan.log" 2>&1 ||
      { cat "$work/plan.log"; fail "ringtrain_plan --save-link on 2x2"; }
    python3 -c "import json,sys; l=json.load(open(sys.argv[1]))['link']; assert 0 <= l['inter_cpu_per_wire'] <= 8, l" \
      "$work/link.json" || fail "the saved link has no transport share"
    timeout -k 5 300 mpirun -np 2 --allow-run-as-root --oversubscribe "$build/ringtrain_plan" "${args[@]}" --hosts 2 \
      --ranks-per-host 2 --link-calibration "$work/link.json" > "$work/file.log" 2>&1 ||
      { cat "$work/file.log"; fail "ringtrain_plan with the saved link"; }
    grep -q "link --link-calibration '$work/link.json'" "$work/file.log" || { cat "$work/file.log"; fail "the file's link"; }
    ;;
  bench)
    BUILD_DIR=$build timeout -k 5 400 /usr/bin/python3 "$src/scripts/bench_cluster.py" --out "$work/bench" --rates 1gbit \
      --repeats 1 --max-bytes 4M --parts allreduce || fail "bench_cluster.py failed"
    cat "$work/bench/summary.md"
    grep -Eq "^\| 1 MiB \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| ring/mpi [0-9.]+, ring/gloo [0-9.]+; ring at [0-9.]+% of the link \|$" \
      "$work/bench/summary.md" || fail "no 2x1 row"
    grep -Eq "hierarchical/gloo [0-9.]+ \|$" "$work/bench/summary.md" || fail "no 2x2 row"
    grep -q "wrong elements: 0" "$work/bench/summary.md" || fail "wrong elements"
    python3 - "$work/bench/summary.md" << 'PY' || fail "busbw above the shaped link rate (0.125 GB/s)"
import re, sys
text = open(sys.argv[1]).read()
section = text.split("2x1")[1].split("###")[0]
cells = [float(x) for x in re.findall(r"\| [0-9]+ MiB \| ([0-9.]+) \|", section)]
sys.exit(0 if cells and all(c <= 0.125 * 1.05 for c in cells) else 1)
PY
    ;;
  kill)
    up 2 --slots 2
    start_training
    t0=$(date +%s.%N)
    "$cluster" kill node1
    job_result "$t0"
    [[ $rc != 0 ]] || fail "the job exited 0 after node1 was killed"
    [[ $rc != 124 && $rc != 137 ]] || fail "the job hung"
    python3 -c "import sys; sys.exit(float(sys.argv[1]) > 30)" "$elapsed" || fail "the job took ${elapsed}s (> 30 s) to end"
    grep -q "node1" "$work/job.log" || fail "the job's messages do not name node1"
    ;;
  partition)
    # Three times: --timeout 60 (Open MPI's daemon keepalive, 11 s here, ends the job first and names
    # node1), --timeout 5 (ringtrain's watchdog ends it first, naming the ranks that stopped answering),
    # and --timeout 5 beside a CPU hog of twice the cores, where either may end it first. Whichever
    # does, the user learns which ranks were cut off: the watchdog names them, and when mpirun names only
    # the host, the startup line "ranks by host" says which ranks it held.
    for timeout_s in 60 5 5-loaded; do
      up 2 --slots 2
      hogs=()
      if [[ $timeout_s == *-loaded ]]; then
        for _ in $(seq $((2 * $(nproc)))); do
          (while :; do :; done) &
          hogs+=($!)
        done
      fi
      start_training --timeout "${timeout_s%-loaded}"
      t0=$(date +%s.%N)
      "$cluster" partition node1
      job_result "$t0"
      ((${#hogs[@]})) && kill "${hogs[@]}" 2> /dev/null
      [[ $rc != 0 ]] || fail "the job exited 0 after node1 was cut off"
      [[ $rc != 124 && $rc != 137 ]] || fail "the job hung"
      python3 -c "import sys; sys.exit(float(sys.argv[1]) > ${timeout_s%-loaded} + 30)" "$elapsed" ||
        fail "the job took ${elapsed}s (> --timeout ${timeout_s%-loaded} + 30 s)"
      grep -q "^ranks by host: node0 0-1, node1 2-3" "$work/job.log" || fail "no 'ranks by host' line: $(head -5 "$work/job.log")"
      named=$(grep -Eq "rank [23] on host node1 does not answer" "$work/job.log" && echo watchdog || true)
      [[ -z $named ]] && grep -Eq "Remote daemon: .* on node node1" "$work/job.log" && named=mpirun
      case $timeout_s in
        5) [[ $named == watchdog ]] || fail "the watchdog did not name node1's ranks" ;;
        60) [[ $named == mpirun ]] || fail "mpirun did not name node1" ;;
        *) [[ -n $named ]] || fail "under load, neither the watchdog nor mpirun named node1: $(tail -20 "$work/job.log")" ;;
      esac
      echo "partition, --timeout $timeout_s: named by $named in ${elapsed}s"
      "$cluster" down > /dev/null
    done
    ;;
  elastic)
    up 2
    "$build/make_shards" synthetic "$work/data" --shape 32x32x3 --count 2000 --classes 10 --shards 2 > /dev/null 2>&1
    common=(--data "$work/data" -a resnet20 -b 16 --steps 60 --log-every 10 --lr 0.05 --threads 1 --checkpoint-every 5)
    supervise() {  # NAME ringtrain_run-args...: in the background, from node0, output in $work/NAME.log
      local name=$1
      shift
      ( timeout -k 5 300 "$cluster" exec node0 "$build/ringtrain_run" --mpirun-args "$("$cluster" mpirun-args) -x RINGTRAIN_INJECT" \
          --probe-timeout 5 "$@" > "$work/$name.log" 2>&1
        echo $? > "$work/$name.rc" ) &
    }
    wait_for() {  # CONDITION [NAME]: until CONDITION holds (false at once if NAME's run has ended)
      for _ in $(seq 1200); do
        eval "$1" && return 0
        [[ -n ${2:-} && -f $work/$2.rc ]] && return 1
        sleep 0.1
      done
      return 1
    }
    export RINGTRAIN_INJECT=
    supervise a --np 2 -- "$build/train_resnet" "${common[@]}" --checkpoint-dir "$work/a" --log-jsonl "$work/a.jsonl"
    wait_for "[[ -f $work/a/ckpt-step00000010.h5 ]]" a || { cat "$work/a.log"; fail "no step-10 checkpoint"; }
    t0=$(date +%s.%N)
    "$cluster" kill node1
    wait
    grep "ringtrain_run:" "$work/a.log"
    [[ $(cat "$work/a.rc") = 0 ]] || { cat "$work/a.log"; fail "the supervised run exited $(cat "$work/a.rc")"; }
    grep -q "dropped node1; relaunching 1 rank(s) on node0 with --accum-steps 2 (same global batch)" "$work/a.log" ||
      fail "no restart line dropping node1"
    grep -q "1 rank(s) on 1 node(s), ring backend, batch 16/rank x 2 accum = 32 global" "$work/a.log" ||
      fail "the relaunch did not keep the global batch"
    resumed=$(python3 - "$work/a.jsonl" "$t0" << 'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
restarts = [x for x in r if x["type"] == "restart"]
assert len(restarts) == 1, restarts
x = restarts[0]
assert x["hosts_dropped"] == ["node1"] and x["world_size"] == 1 and x["accum_steps"] == 2 and x["global_batch_kept"], x
rec = next(x for x in r if x["type"] == "recovered")
recovery = rec["first_step_time"] - float(sys.argv[2])
assert 0 < recovery < 60, f"recovery took {recovery:.1f} s"
assert r[-1]["type"] == "supervisor" and r[-1]["outcome"] == "finished" and r[-1]["restarts"] == 1, r[-1]
print(rec["resumed_step"])
print(f"recovery {recovery:.1f} s from the kill to the first step, {rec['lost_steps']} step(s) lost", file=sys.stderr)
PY
) || fail "the JSONL log's restart records"
    ((resumed >= 10)) || fail "resumed from step $resumed, before the step-10 checkpoint"
    ckpt=$(printf "ckpt-step%08d.h5" "$resumed")
    timeout -k 5 300 mpirun -np 1 --allow-run-as-root "$build/train_resnet" "${common[@]}" --accum-steps 2 \
      --checkpoint-dir "$work/b" --resume "$work/a/$ckpt" > "$work/b.log" 2>&1 || { cat "$work/b.log"; fail "node0-alone resume"; }
    "$build/tests/compare_checkpoints" "$work/a/ckpt-step00000060.h5" "$work/b/ckpt-step00000060.h5" ||
      fail "the recovered run is not the node0-alone run from $ckpt"
    # Grow back: node1 is revived while the run goes on alone; the next failure brings it back in.
    "$cluster" revive node1
    RINGTRAIN_INJECT=throw:0:40:1 supervise c --np 2 -- "$build/train_resnet" "${common[@]}" --checkpoint-dir "$work/c"
    wait_for "[[ -f $work/c/ckpt-step00000010.h5 ]]" c || { cat "$work/c.log"; fail "c: no step-10 checkpoint"; }
    "$cluster" kill node1
    wait_for "grep -q 'restart 1 is training again' $work/c.log" c || { cat "$work/c.log"; fail "c: no first restart"; }
    "$cluster" revive node1
    wait
    grep "ringtrain_run:" "$work/c.log"
    [[ $(cat "$work/c.rc") = 0 ]] || { cat "$work/c.log"; fail "c: exit $(cat "$work/c.rc")"; }
    grep -q "restart 2 of 3: rank 0 (node0): injected failure at step 40; back: node1; relaunching 2 rank(s) on node0, node1 with --accum-steps 1" \
      "$work/c.log" || fail "c: did not grow back to node1"
    grep -q "finished after 2 restart(s)" "$work/c.log" || fail "c: no summary"
    ;;
  slurm_*)
    for tool in slurmctld slurmd munged sbatch; do
      command -v "$tool" > /dev/null || { echo "SKIP: real Slurm needs '$tool' (scripts/setup.sh installs it)"; exit 77; }
    done
    up 2 --slurm
    in0() { timeout -k 5 60 "$cluster" exec node0 "$@"; }
    # The sbatch script on 2 nodes x 1 CPU task; its settings from the environment, as a user submits it.
    submit() {  # STEPS [sbatch args...]: prints the job id
      local steps=$1
      shift
      (cd "$work" && RINGTRAIN_BUILD="$build" ARCH=resnet20 BATCH=16 EPOCHS=1 WARMUP_EPOCHS=0 MAX_RESTARTS=2 \
        EXTRA="--steps $steps --image-size 32 --threads 1 --synthetic-size 4096 --checkpoint-every 5 --log-every 5" \
        in0 sbatch --parsable --nodes=2 --ntasks-per-node=1 --gpus-per-node=0 --cpus-per-task=1 "$@" \
        "$src/scripts/slurm/train_resnet.sbatch")
    }
    state_of() { in0 scontrol show job "$1" | grep -oE "JobState=[A-Z_]+" | cut -d= -f2; }
    wait_state() {  # JOB SECONDS: until the job has ended; prints its state
      local s
      for _ in $(seq $((2 * $2))); do
        s=$(state_of "$1")
        [[ $s =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL)$ ]] && { echo "$s"; return 0; }
        sleep 0.5
      done
      echo "still ${s:-?}"
    }
    wait_file() { for _ in $(seq $((10 * $2))); do [[ -f $1 ]] && return 0; sleep 0.1; done; return 1; }
    case $scenario in
      slurm_sbatch)
        (cd "$work" && RINGTRAIN_BUILD="$build" ARCH=resnet20 BATCH=16 EPOCHS=1 WARMUP_EPOCHS=0 \
          EXTRA="--steps 4 --image-size 32 --threads 1 --synthetic-size 256" timeout -k 5 300 "$cluster" exec node0 \
          sbatch --wait --nodes=2 --ntasks-per-node=1 --gpus-per-node=0 --cpus-per-task=1 \
          "$src/scripts/slurm/train_resnet.sbatch") || { cat "$work"/*.out; fail "sbatch --wait failed"; }
        cat "$work"/*.out
        grep -q "launching 2 rank(s) on node0, node1 (from the Slurm allocation (node\[0-1\]))" "$work"/*.out ||
          fail "ringtrain_run did not take its hosts from the allocation"
        grep -q "2 rank(s) on 2 node(s)" "$work"/*.out || fail "not on 2 nodes"
        grep -q "finished after 0 restart(s)" "$work"/*.out || fail "no clean finish"
        ;;
      slurm_node_loss)
        id=$(submit 120) || fail "sbatch failed"
        wait_file "$work/runs/$id/ckpt-step00000010.h5" 120 || { cat "$work"/*.out; fail "no step-10 checkpoint"; }
        "$cluster" kill node1
        st=$(wait_state "$id" 240)
        cat "$work"/*.out
        [[ $st = COMPLETED ]] || fail "the job ended $st"
        grep -q "host(s) lost: node1; dropped node1; relaunching 1 rank(s) on node0 with --accum-steps 2 (same global batch)" \
          "$work"/*.out || fail "no relaunch on node0 with the global batch kept"
        grep -q "finished after 1 restart(s)" "$work"/*.out || fail "not finished after one restart"
        in0 sinfo -N -h -o '%N %t' | grep -q "node1 down" || fail "Slurm does not have node1 down: $(in0 sinfo -N -h)"
        ;;
      slurm_scancel)
        id=$(submit 100000) || fail "sbatch failed"
        wait_file "$work/runs/$id/ckpt-step00000010.h5" 120 || { cat "$work"/*.out; fail "no step-10 checkpoint"; }
        in0 scancel "$id"
        st=$(wait_state "$id" 60)
        cat "$work"/*.out
        [[ $st = CANCELLED ]] || fail "scancel left the job $st"
        in0 scontrol show job "$id" | grep -q "ExitCode=143:0" || fail "exit status: $(in0 scontrol show job "$id" | grep -o 'ExitCode=[^ ]*')"
        grep -q "ringtrain_run: stopped by signal 15 (Terminated); not restarting" "$work"/*.out ||
          fail "the supervisor did not say it was cancelled"
        newest=$(ls "$work/runs/$id"/ckpt-step*.h5 | tail -1)
        timeout -k 5 120 "$build/train_resnet" --synthetic -a resnet20 -b 32 --image-size 32 --threads 1 \
          --synthetic-size 4096 --epochs 1 --warmup-epochs 0 --lr-scaling linear --label-smoothing 0.1 \
          --steps $(( $(basename "$newest" .h5 | sed 's/ckpt-step0*//') + 2 )) --checkpoint-dir "$work/cont" \
          --resume "$newest" > "$work/cont.log" 2>&1 || { cat "$work/cont.log"; fail "the kept checkpoint $newest does not resume"; }
        grep -q "resumed from $newest" "$work/cont.log" || fail "not resumed from $newest"
        ;;
      slurm_requeue)
        id=$(submit 40) || fail "sbatch failed"
        wait_file "$work/runs/$id/ckpt-step00000010.h5" 120 || { cat "$work"/*.out; fail "no step-10 checkpoint"; }
        # The nodes share one process table: the job's slurmstepds are visible here, named by job id.
        stepds() { pgrep -f "^slurmstepd: \[$id\." > /dev/null; }
        stepds || fail "cannot see job $id's slurmstepd processes (the wait below would prove nothing)"
        in0 scontrol requeue "$id" || fail "scontrol requeue failed"
        requeued_at=$(date +%s)
        # A requeued job waits out a begin time of its own (about 2 minutes); the test does not, so it waits
        # for what that delay covers: the first run's slurmstepds gone. The batch step's stepd reports the
        # script's end (exit 143) to slurmctld before it exits, and slurmctld applies a batch completion to
        # whatever run the job id has: a report landing after the second run started would end that run
        # FAILED before its script printed anything (the likely cause of one failure on a slow CI machine).
        for _ in $(seq 240); do stepds || break; sleep 0.25; done
        stepds && fail "job $id's first run still has slurmstepd processes 60 s after the requeue"
        # The delay also covers the first run's credential: slurmctld revoked it at the requeue, stamped with
        # that second, and a slurmd takes any credential of the job issued in the same second for the revoked
        # one (it compares whole seconds: ctime <= revoked). A second run allocated within that second is
        # refused its batch launch (or its srun step on node1) and the job ends FAILED before its script says
        # anything; how often depends on how fast the machine gets from the requeue to the allocation. So the
        # job is released only once the clock has passed the requeue's second (scontrol returned after it).
        while (( $(date +%s) <= requeued_at + 1 )); do sleep 0.1; done
        for _ in $(seq 120); do
          [[ $(state_of "$id") = PENDING ]] && in0 scontrol update JobId="$id" StartTime=now 2> /dev/null && break
          sleep 0.25
        done
        st=$(wait_state "$id" 300)
        cat "$work"/*.out
        [[ $st = COMPLETED ]] || fail "the requeued job ended $st"
        grep -q "(restart 1)" "$work"/*.out || fail "the job did not run again"
        grep -qE "resumed from runs/$id/ckpt-step000000[1-9][0-9].h5" "$work"/*.out ||
          fail "the requeued job did not resume from its checkpoint"
        [[ -f $work/runs/$id/ckpt-step00000040.h5 ]] || fail "no final checkpoint"
        ;;
    esac
    ;;
  *) echo "unknown scenario '$scenario'"; exit 2 ;;
esac
echo "cluster test $scenario: PASS"
