#!/usr/bin/env bash
# scripts/bench_weak_scaling.sh: weak scaling 1 -> N ranks on one machine, ringtrain (GradSync over the
# ring backend) beside PyTorch DDP (gloo) in the same run. Per-rank batch and threads stay fixed;
# efficiency = step time at 1 rank / step time at N ranks (1.00 = perfect). The same N processes run
# side by side without synchronising (bench_step --backend none) give the machine's own ceiling: what
# N ranks lose to sharing cores, caches and memory bandwidth before any communication.
#   scripts/bench_weak_scaling.sh [DEPTH=20] [BATCH=64] [THREADS=1] [RANKS=2] [STEPS=10] [REPEATS=3]
# Each configuration runs REPEATS times, interleaved; the medians are reported.
set -euo pipefail
cd "$(dirname "$0")/.."
depth=${1:-20}; batch=${2:-64}; threads=${3:-1}; ranks=${4:-2}; steps=${5:-10}; repeats=${6:-3}
[[ -x build/bench_step ]] || { echo "build/bench_step missing: run scripts/setup.sh" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
last() { if (($#)); then echo "${@: -1}"; else echo "?"; fi; }  # the last argument, or ? when none
median() { python3 -c "import sys,statistics; print(statistics.median([float(x) for x in sys.argv[1:]]) if sys.argv[1:] else float(\"nan\"))" "$@"; }
o1=(); oN=(); oI=(); t1=(); tN=(); waits=()
for rep in $(seq "$repeats"); do
  o1+=("$(mpirun -np 1 ./build/bench_step -a "resnet$depth" -b "$batch" --threads "$threads" --steps "$steps" | field median_step_s)")
  line=$(mpirun -np "$ranks" --oversubscribe ./build/bench_step -a "resnet$depth" -b "$batch" --threads "$threads" --steps "$steps")
  oN+=("$(echo "$line" | field median_step_s)"); waits+=("$(echo "$line" | field comm_wait_s)")
  oI+=("$(mpirun -np "$ranks" --oversubscribe ./build/bench_step -a "resnet$depth" -b "$batch" --threads "$threads" \
          --steps "$steps" --backend none | field median_step_s)")
  # The peer has hung here once (a gloo process left waiting for a partner that had died): a deadline,
  # and a repeat it does not finish is left out of its median.
  for n in 1 "$ranks"; do
    t=$(timeout -k 10 600 /usr/bin/python3 scripts/peers/torch_ddp_step.py "$n" "$depth" "$batch" "$threads" "$steps" | field median_step_s || true)
    if [[ -z $t ]]; then
      echo "repeat $rep: torch ddp with $n rank(s) failed or passed 600 s; left out" >&2
    elif [[ $n = 1 ]]; then t1+=("$t"); else tN+=("$t"); fi
  done
  echo "repeat $rep: ringtrain ${o1[-1]}s -> ${oN[-1]}s (wait ${waits[-1]}s; unsynchronised ${oI[-1]}s);" \
       "torch ddp $(last "${t1[@]}")s -> $(last "${tN[@]}")s"
done
mo1=$(median "${o1[@]}"); moN=$(median "${oN[@]}"); moI=$(median "${oI[@]}"); mt1=$(median "${t1[@]}"); mtN=$(median "${tN[@]}")
python3 - "$mo1" "$moN" "$mt1" "$mtN" "$(median "${waits[@]}")" "$moI" <<PY
import sys
o1, oN, t1, tN, w, oI = map(float, sys.argv[1:])
print(f"resnet$depth batch $batch/rank threads $threads: 1 -> $ranks ranks (medians of $repeats)")
print(f"  ringtrain  step {o1:.4f}s -> {oN:.4f}s  efficiency {o1/oN:.3f}  exposed comm {w*1000:.1f} ms")
print(f"  ceiling    step {o1:.4f}s -> {oI:.4f}s  efficiency {o1/oI:.3f}  ($ranks ringtrain ranks side by side, no sync)")
print(f"  ringtrain efficiency / ceiling: {oI/oN:.3f}")
print(f"  torch ddp  step {t1:.4f}s -> {tN:.4f}s  efficiency {t1/tN:.3f}")
print(f"  ringtrain / torch step time at $ranks ranks: {oN/tN:.2f}")
PY
