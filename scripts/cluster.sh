#!/usr/bin/env bash
# scripts/cluster.sh: an emulated cluster on one machine. Every node is a Linux network namespace with its
# own address and host name; the nodes are joined by veth pairs through a bridge that lives in a namespace
# of its own ("the switch"), every link shaped with tc as asked. Open MPI runs one daemon per node and
# speaks TCP between them, exactly as between machines; ranks on one node use shared memory.
#
#   cluster.sh up N [--rate 10gbit] [--delay 50us] [--slots K] [--slurm]
#                                                                make node0..node{N-1}, write a hostfile; --slurm:
#                                                                real Slurm in them (slurmctld in node0, a slurmd in
#                                                                every node with K cores, one partition, munge)
#   cluster.sh run [mpirun args...] -- PROGRAM ARGS              an MPI job across the nodes, from node0
#   cluster.sh exec NODE CMD...                                  a command inside NODE (its net + host name)
#   cluster.sh mpirun-args                                       the mpirun options for the cluster that is up
#   cluster.sh kill NODE                                         NODE fails: every process dies at once (kill -9)
#                                                                and it stays down (nothing enters it) until revive
#   cluster.sh revive NODE                                       a killed NODE is back, empty, as after a reboot
#   cluster.sh partition NODE | heal NODE                        NODE's link drops every packet (no RST) | back
#   cluster.sh status                                            what is up
#   cluster.sh down                                              remove everything it made (idempotent)
#
# What it touches: network namespaces named rtc-* (rtc-switch, rtc-node0, ...), addresses of 10.213.7.0/24
# inside them only (RT_CLUSTER_PREFIX and RT_CLUSTER_NET below change both), /etc/netns/rtc-node*/ (the
# per-node /etc/hosts that `ip netns exec` mounts) and its state folder (RT_CLUSTER_STATE, default
# /run/ringtrain-cluster). The machine's own network namespace and interfaces are never changed. Needs root, iproute2 (ip, tc, bridge) and util-linux (unshare).
# With --slurm: Debian's slurmctld, slurmd, munge and slurm-client; every file of it (slurm.conf, the munge
# key and socket, spool and state folders) is under $STATE/slurm, its daemons run inside
# the nodes (munged in node0), and `exec`/`run` give commands SLURM_CONF and the cluster's Open MPI
# settings. The machine's own /etc/slurm and munge are never read or touched.
# Exit status: 0 done, 1 failed (the message says what), 2 usage, 3 cannot run here (not root, no ip).
set -euo pipefail

# RT_CLUSTER_PREFIX, RT_CLUSTER_NET and RT_CLUSTER_STATE let a second cluster live beside the first (the
# tests use their own, so they never touch one a user has up).
readonly PREFIX=${RT_CLUSTER_PREFIX:-rtc}
readonly SWITCH=${PREFIX}-switch
readonly NET=${RT_CLUSTER_NET:-10.213.7}
readonly SUBNET=${NET}.0/24
readonly STATE=${RT_CLUSTER_STATE:-/run/ringtrain-cluster}
readonly MAX_NODES=64
self=$(readlink -f "$0")

die() { echo "cluster.sh: $*" >&2; exit 1; }
[[ $PREFIX =~ ^[a-z][a-z0-9]{1,7}$ ]] || die "RT_CLUSTER_PREFIX '$PREFIX' must be 2-8 lower-case letters or digits"
[[ $NET =~ ^10\.([0-9]{1,3})\.([0-9]{1,3})$ ]] && ((BASH_REMATCH[1] < 256 && BASH_REMATCH[2] < 256)) ||
  die "RT_CLUSTER_NET '$NET' must be the first three parts of a 10.x.y.0/24 network, e.g. 10.213.7"
usage() { sed -n '/^#   cluster.sh/s/^#   //p' "$self" >&2; exit 2; }

can_run() {
  [[ $(id -u) = 0 ]] || { echo "cluster.sh: needs root (it makes network namespaces)" >&2; exit 3; }
  local tool
  for tool in ip tc bridge unshare hostname; do
    command -v "$tool" > /dev/null || { echo "cluster.sh: needs '$tool' (iproute2 / util-linux)" >&2; exit 3; }
  done
}

is_up() { [[ -f $STATE/nodes ]]; }
nodes() { cat "$STATE/nodes"; }
addr_of() { echo "$NET.$(($1 + 1))"; }

# NODE name -> index; an error naming the node when it is not part of the cluster that is up.
node_index() {
  is_up || die "no cluster is up (cluster.sh up N first)"
  local name=$1 n
  n=$(nodes)
  [[ $name =~ ^node([0-9]+)$ ]] && ((10#${BASH_REMATCH[1]} < n)) ||
    die "unknown node '$name': the cluster that is up has node0..node$((n - 1))"
  echo $((10#${BASH_REMATCH[1]}))
}

# A killed node is down until revived: exec and the launch agent refuse it, as ssh to a dead machine fails.
is_down() { [[ -f $STATE/down-node$1 ]]; }
is_partitioned() { grep -q "state disabled" <<< "$(ip netns exec "$SWITCH" bridge link show dev "sw$1")"; }

# Runs CMD in node K with its host name; used by exec, run and the launch agent.
in_node() {
  local k=$1
  is_down "$k" && { echo "cluster.sh: node$k is down (killed; cluster.sh revive node$k brings it back)" >&2; exit 255; }
  shift
  if [[ -f $STATE/slurm/env ]]; then
    set -a
    # shellcheck disable=SC1091
    . "$STATE/slurm/env"
    set +a
  fi
  exec ip netns exec "$PREFIX-node$k" unshare --uts -- /bin/sh -c 'hostname "$0" && exec "$@"' "node$k" "$@"
}

pids_of() { ip netns pids "$1" 2> /dev/null || true; }

kill_namespace() {
  local ns=$1 round pids
  for round in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(pids_of "$ns")
    [[ -z $pids ]] && return 0
    # shellcheck disable=SC2086
    kill -9 $pids 2> /dev/null || true
    sleep 0.1
  done
  [[ -z $(pids_of "$ns") ]] || echo "cluster.sh: processes of $ns survived kill -9: $(pids_of "$ns" | tr '\n' ' ')" >&2
}

down() {
  local ns
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep -E "^$PREFIX-(switch|node[0-9]+)$" || true); do
    kill_namespace "$ns"
    ip netns del "$ns" 2> /dev/null || true
  done
  rm -rf /etc/netns/"$PREFIX"-node* "$STATE"
  rmdir /etc/netns 2> /dev/null || true
}

# tc rate: a number with a tc unit, e.g. 10gbit, 500mbit.
rate_ok() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit)$ ]]; }
delay_ok() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]]; }
rate_bits() {
  python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmgt]?)bit',sys.argv[1]); print(int(float(m[1])*{'':1,'k':1e3,'m':1e6,'g':1e9,'t':1e12}[m[2]]))" "$1"
}

# Shapes the egress of DEV in namespace NS: netem delay (when asked) and a token bucket at RATE. Both ends of
# a link are shaped, so each direction runs at RATE.
shape() {
  local ns=$1 dev=$2 rate=$3 delay=$4 parent=root burst bits
  if [[ $delay != none ]]; then
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" 2> /dev/null ||
      die "--delay $delay needs tc's netem qdisc, which this kernel lacks (sch_netem): leave --delay out (links then add no latency)"
    parent="parent 1:1"
  fi
  if [[ $rate != none ]]; then
    bits=$(rate_bits "$rate")
    # The bucket holds 1 ms at the rate (a transfer of less than that can pass at the veth's own speed),
    # and at least two 64 KiB GSO packets (a packet larger than the bucket would be dropped for ever).
    burst=$((bits / 8 / 1000))
    ((burst < 131072)) && burst=131072
    # shellcheck disable=SC2086
    ip netns exec "$ns" tc qdisc add dev "$dev" $parent handle 10: tbf rate "$rate" burst "$burst" latency 100ms ||
      die "tc could not shape $dev in $ns to $rate"
  fi
}

write_agent() {
  # Open MPI's launch agent (plm_rsh_agent): called as `agent [ssh options] HOST COMMAND...` like ssh,
  # it runs the command line in HOST through `cluster.sh exec` instead of logging in (as over ssh, the
  # command is one shell line).
  cat > "$STATE/agent" << EOF
#!/usr/bin/env bash
# Launch agent of scripts/cluster.sh (Open MPI plm_rsh_agent): enters a node instead of ssh.
while [[ \${1:-} == -* ]]; do shift; done
host=\${1:?agent: no host given}
shift
export RT_CLUSTER_PREFIX=$PREFIX RT_CLUSTER_NET=$NET RT_CLUSTER_STATE=$STATE
# As ssh: a node that is down or cut off from the caller's does not answer (exit 255, ssh's own status).
exec $self agent-exec "\$host" /bin/sh -c "\$*"
EOF
  chmod +x "$STATE/agent"
}

# Real Slurm on the nodes that are up (cluster.sh up N --slurm): munge's key and daemon (in node0; its
# socket is a file every node reaches), slurm.conf with one partition of every node at its slots, slurmctld
# in node0, a slurmd in every node. A slurmd gets a mount namespace of its own (ip netns exec's) holding
# an empty cgroup root (Slurm mounts what it needs: the node's /sys is its namespace's). The nodes share
# every filesystem, /tmp included: `srun --mpi=pmix` across them fails (each node's slurmstepd makes the
# same PMIx folder in /tmp); mpirun under Slurm (ringtrain_run, the sbatch script) does not use it.
slurm_up() {
  local n=$1 slots=$2 s=$STATE/slurm k
  for tool in slurmctld slurmd munged sbatch srun sinfo scontrol; do
    command -v "$tool" > /dev/null ||
      die "--slurm needs '$tool' (Debian's slurmctld, slurmd, munge, slurm-client; scripts/setup.sh installs them)"
  done
  mkdir -p "$s/ctld" "$s/munge"
  chmod 700 "$s/munge"
  head -c 1024 /dev/urandom > "$s/munge/munge.key"
  chmod 400 "$s/munge/munge.key"
  {
    echo "ClusterName=ringtrain"
    echo "SlurmctldHost=node0($(addr_of 0))"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$s/munge/munge.socket"
    echo "CredType=cred/munge"
    echo "StateSaveLocation=$s/ctld"
    echo "SlurmdSpoolDir=$s/spool-%n"
    echo "SlurmctldPidFile=$s/slurmctld.pid"
    echo "SlurmdPidFile=$s/slurmd-%n.pid"
    echo "SlurmctldLogFile=$s/slurmctld.log"
    echo "SlurmdLogFile=$s/slurmd-%n.log"
    echo "SlurmctldPort=6817"
    echo "SlurmdPort=6818"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SlurmdParameters=config_overrides"
    echo "MpiDefault=none"
    # A node that died and comes back (revive) returns to service by itself; a dead one is DOWN after 10 s.
    echo "ReturnToService=2"
    echo "SlurmdTimeout=10"
    echo "SlurmctldTimeout=10"
    echo "MessageTimeout=5"
    echo "InactiveLimit=0"
    echo "KillWait=10"
    echo "MinJobAge=600"
    echo "JobRequeue=1"
    for ((k = 0; k < n; ++k)); do
      echo "NodeName=node$k NodeAddr=$(addr_of "$k") CPUs=$slots State=UNKNOWN"
    done
    echo "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } > "$s/slurm.conf"
  printf 'CgroupPlugin=cgroup/v1\nCgroupAutomount=yes\n' > "$s/cgroup.conf"
  # What every command entering a node gets (in_node): Slurm's config and Open MPI on the cluster's links.
  {
    echo "SLURM_CONF=$s/slurm.conf"
    echo "OMPI_MCA_btl=tcp,vader,self"
    echo "OMPI_MCA_pml=ob1"
    echo "OMPI_MCA_btl_tcp_if_include=$SUBNET"
    echo "OMPI_MCA_oob_tcp_if_include=$SUBNET"
    [[ $(id -u) = 0 ]] && echo "OMPI_ALLOW_RUN_AS_ROOT=1" && echo "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
  } > "$s/env"
  "$self" exec node0 munged --key-file="$s/munge/munge.key" --socket="$s/munge/munge.socket" \
    --pid-file="$s/munge/munged.pid" --log-file="$s/munge/munged.log" --seed-file="$s/munge/munged.seed" --force ||
    die "munged did not start (see $s/munge/munged.log)"
  "$self" exec node0 slurmctld -f "$s/slurm.conf" || die "slurmctld did not start (see $s/slurmctld.log)"
  for ((k = 0; k < n; ++k)); do slurmd_up "$k"; done
  local tries
  for ((tries = 0; tries < 100; ++tries)); do
    [[ $("$self" exec node0 sinfo -h -o '%t' -N 2> /dev/null | grep -c '^idle') -eq $n ]] && break
    sleep 0.2
  done
  ((tries < 100)) || die "Slurm's nodes did not come up idle: $("$self" exec node0 sinfo -N 2>&1 | tr '\n' ' ')"
}

# A slurmd in node K (at up, and when a killed node is revived).
slurmd_up() {
  local k=$1 s=$STATE/slurm
  mkdir -p "$s/spool-node$k"
  "$self" exec "node$k" /bin/sh -c "mount -t tmpfs cgroup_root /sys/fs/cgroup && exec slurmd -f '$s/slurm.conf' -N node$k" ||
    die "slurmd did not start in node$k (see $s/slurmd-node$k.log)"
}

up() {
  local n=${1:-} rate=none delay=none slots=1 slurm=0 k
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= MAX_NODES)) || die "up: N must be a number of nodes from 1 to $MAX_NODES, got '${n}'"
  shift
  while (($#)); do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value}; shift 2 ;;
      --slots) slots=${2:?--slots needs a value}; shift 2 ;;
      --slurm) slurm=1; shift ;;
      *) die "up: unknown option '$1' (--rate, --delay, --slots, --slurm)" ;;
    esac
  done
  [[ $rate = none ]] || rate_ok "$rate" || die "--rate '$rate' is not a tc rate such as 10gbit, 500mbit"
  [[ $delay = none ]] || delay_ok "$delay" || die "--delay '$delay' is not a time such as 50us, 1ms"
  [[ $slots =~ ^[0-9]+$ ]] && ((slots >= 1)) || die "--slots must be a positive number, got '$slots'"
  if is_up || grep -qE "^$PREFIX-" <<< "$(ip netns list 2> /dev/null)"; then
    die "a cluster is already up ($(cat "$STATE/nodes" 2> /dev/null || echo '?') nodes): cluster.sh down first"
  fi
  # Whatever ends `up` early (a failed command, die, Ctrl-C) removes what it made.
  trap 'rc=$?; trap - EXIT; if ((rc != 0)); then echo "cluster.sh: up did not finish; removed what it made" >&2; down; fi; exit $rc' EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$STATE"
  ip netns add "$SWITCH"
  ip netns exec "$SWITCH" ip link add br0 type bridge
  ip netns exec "$SWITCH" ip link set br0 up
  ip netns exec "$SWITCH" ip link set lo up
  : > "$STATE/hostfile"
  local hosts="127.0.0.1 localhost"$'\n'
  for ((k = 0; k < n; ++k)); do hosts+="$(addr_of "$k") node$k"$'\n'; done
  for ((k = 0; k < n; ++k)); do
    local ns=$PREFIX-node$k
    ip netns add "$ns"
    mkdir -p "/etc/netns/$ns"
    printf '%s' "$hosts" > "/etc/netns/$ns/hosts"
    # Made in the switch, one end moved into the node: the machine's own namespace never holds either.
    ip netns exec "$SWITCH" ip link add "sw$k" type veth peer name eth0 netns "$ns"
    ip netns exec "$SWITCH" ip link set "sw$k" master br0 up
    ip netns exec "$ns" ip link set lo up
    # A peer that stopped answering fails a connection with unacknowledged data after 5 retransmissions
    # (about 13 s) instead of the default 15 (about 15 minutes): mpirun aborting a job sends to every
    # daemon, and waits for that send to fail before it declares a partitioned node lost. Per namespace.
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5
    ip netns exec "$ns" ip addr add "$(addr_of "$k")/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    shape "$ns" eth0 "$rate" "$delay"
    shape "$SWITCH" "sw$k" "$rate" "$delay"
    echo "node$k slots=$slots" >> "$STATE/hostfile"
  done
  write_agent
  printf 'rate=%s\ndelay=%s\nslots=%s\n' "$rate" "$delay" "$slots" > "$STATE/config"
  echo "$n" > "$STATE/nodes"
  # node0 must reach every other node over TCP before the cluster is called up (there may be no ping).
  for ((k = 1; k < n; ++k)); do
    reach "$k" || die "node0 cannot reach node$k ($(addr_of "$k")) over TCP"
  done
  ((slurm)) && slurm_up "$n" "$slots"
  trap - EXIT INT TERM
  echo "cluster up: $n node(s) on $SUBNET, rate $rate, delay $delay, $slots slot(s) each; hostfile $STATE/hostfile"
  ((slurm)) && echo "slurm up: slurmctld on node0, slurmd on node0..node$((n - 1)), partition main; SLURM_CONF=$STATE/slurm/slurm.conf"
  return 0
}

# A TCP connection from node0 to node K (a listener there, 5 s at most).
reach() {
  local k=$1 addr
  addr=$(addr_of "$k")
  ip netns exec "$PREFIX-node$k" timeout 5 python3 -c "import socket; s=socket.create_server(('$addr', 7999)); s.accept()" &
  local listener=$!
  ip netns exec "$PREFIX-node0" timeout 5 python3 -c "
import socket, time
for _ in range(100):
    try: socket.create_connection(('$addr', 7999), timeout=1).close(); break
    except OSError: time.sleep(0.05)
else: raise SystemExit(1)"
  local rc=$?
  wait "$listener" 2> /dev/null || true
  return $rc
}

mpirun_args() {
  is_up || die "no cluster is up (cluster.sh up N first)"
  local args=(--hostfile "$STATE/hostfile" --mca plm_rsh_agent "$STATE/agent" --mca plm_rsh_no_tree_spawn 1
    --mca pml ob1 --mca btl tcp,vader,self --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET"
    # A daemon whose node stopped answering (a partition) is declared lost after 5 + 3 x 2 s of silence
    # instead of TCP's minutes, so mpirun ends the job naming the node.
    --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3
    # Every node's daemon would bind its first rank to core 0, the same physical core on every node.
    --bind-to none)
  [[ $(id -u) = 0 ]] && args+=(--allow-run-as-root)
  echo "${args[@]}"
}

status() {
  if ! is_up; then echo "no cluster is up"; return 0; fi
  local n k
  n=$(nodes)
  echo "cluster: $n node(s) on $SUBNET; $(tr '\n' ' ' < "$STATE/config")"
  for ((k = 0; k < n; ++k)); do
    local state=up
    is_partitioned "$k" && state=partitioned
    is_down "$k" && state=down
    echo "  node$k $(addr_of "$k") $state, $(pids_of "$PREFIX-node$k" | wc -l) process(es)"
  done
}

main() {
  local verb=${1:-}
  (($#)) && shift
  case $verb in
    up) can_run; up "$@" ;;
    down) can_run; down; echo "cluster down" ;;
    status) can_run; status ;;
    mpirun-args) mpirun_args ;;
    exec)
      can_run
      (($# >= 2)) || die "exec: usage: cluster.sh exec NODE CMD..."
      local k
      k=$(node_index "$1")
      shift
      in_node "$k" "$@"
      ;;
    run)
      can_run
      is_up || die "no cluster is up (cluster.sh up N first)"
      local pre=() args
      while (($#)) && [[ $1 != -- ]]; do pre+=("$1"); shift; done
      if (($#)); then shift; else set -- "${pre[@]}"; pre=(); fi
      (($#)) || die "run: no program given (cluster.sh run [mpirun args...] -- PROGRAM ARGS)"
      read -r -a args <<< "$(mpirun_args)"
      in_node 0 mpirun "${args[@]}" "${pre[@]}" "$@"
      ;;
    agent-exec)
      # The launch agent's way in (not for people): exec, refused across a partition as over a network.
      can_run
      local k caller
      k=$(node_index "$1")
      shift
      caller=$(hostname)
      if [[ $caller =~ ^node([0-9]+)$ ]] && ((10#${BASH_REMATCH[1]} != k)) &&
        { is_partitioned "$k" || is_partitioned "$((10#${BASH_REMATCH[1]}))"; }; then
        echo "ssh: connect to host node$k: Connection timed out (cluster.sh: partitioned)" >&2
        exit 255
      fi
      in_node "$k" "$@"
      ;;
    kill)
      can_run
      (($# == 1)) || die "kill: usage: cluster.sh kill NODE"
      local k
      k=$(node_index "$1")
      : > "$STATE/down-node$k"
      kill_namespace "$PREFIX-node$k"
      echo "node$k: every process killed; down until cluster.sh revive node$k"
      ;;
    revive)
      can_run
      (($# == 1)) || die "revive: usage: cluster.sh revive NODE"
      local k
      k=$(node_index "$1")
      is_down "$k" || die "revive: node$k is not down"
      kill_namespace "$PREFIX-node$k"
      rm -f "$STATE/down-node$k"
      # As after a reboot its slurmd starts again, and Slurm takes the node back (ReturnToService=2).
      [[ -f $STATE/slurm/slurm.conf ]] && slurmd_up "$k"
      echo "node$k: back up"
      ;;
    partition | heal)
      can_run
      (($# == 1)) || die "$verb: usage: cluster.sh $verb NODE"
      local k
      k=$(node_index "$1")
      # The switch's port of the node stops forwarding: packets both ways vanish, both ends keep their
      # carrier, nobody sends a reset. heal forwards again.
      ip netns exec "$SWITCH" bridge link set dev "sw$k" state "$([[ $verb = partition ]] && echo 0 || echo 3)"
      echo "node$k: $([[ $verb = partition ]] && echo partitioned || echo healed)"
      ;;
    -h | --help | help) usage ;;
    *) usage ;;
  esac
}

main "$@"
