#!/usr/bin/env bash
# scripts/bench_vs_pytorch.sh: CPU training-step time of ringtrain's ResNet against PyTorch's in the same
# run, for each thread count and batch size, with the ratios ringtrain / PyTorch (below 1: ringtrain is
# faster) and every program's peak RSS. The peer is scripts/peers/torch_resnet_step.py (the same ResNet, SGD
# step and batch): run by Debian's PyTorch 1.13 (NCHW eager) and, when PEER_PYTHON names its interpreter
# (default /opt/torch2/bin/python if it exists), by a modern PyTorch from PyPI (channels_last eager: the
# fastest CPU training mode measured; make it with
#   python3 -m venv /opt/torch2 && /opt/torch2/bin/pip install torch==2.15.0 numpy
# about 5.5 GB, for benchmarks only). ROUNDS interleaved rounds (default 3), medians reported.
# Usage: scripts/bench_vs_pytorch.sh [ARCH_DEPTH=20] [STEPS=5]   (BUILD_DIR: default build;
#        CONFIGS: default "1:32 1:128 2:32 2:128", threads:batch pairs)
set -euo pipefail
cd "$(dirname "$0")/.."
depth=${1:-20}
steps=${2:-5}
build=${BUILD_DIR:-build}
rounds=${ROUNDS:-3}
configs=${CONFIGS:-"1:32 1:128 2:32 2:128"}
peer=scripts/peers/torch_resnet_step.py
peer_python=${PEER_PYTHON:-}
[[ -z "$peer_python" && -x /opt/torch2/bin/python ]] && peer_python=/opt/torch2/bin/python
[[ -x "$build/bench_step" ]] || { echo "$build/bench_step missing: run scripts/setup.sh" >&2; exit 1; }
echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; resnet$depth 32x32x3 fp32 SGD, $rounds interleaved rounds"
[[ -n "$peer_python" ]] && echo "== modern peer: $("$peer_python" -c 'import torch; print("torch", torch.__version__)')"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Runs a command under GNU time; prints its output line, then "rss_mb=..." (peak resident set).
measure() {
  /usr/bin/time -f "rss_kb=%M" -o "$tmp/time" "$@"
  echo "rss_mb=$(( $(sed -n 's/rss_kb=//p' "$tmp/time") / 1024 ))"
}
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | head -1; }
for round in $(seq "$rounds"); do
  for config in $configs; do
    threads=${config%:*}; batch=${config#*:}
    measure timeout 900 "$build/bench_step" -a "resnet$depth" -b "$batch" --threads "$threads" --steps "$steps" > "$tmp/ours"
    measure timeout 900 /usr/bin/python3 "$peer" -a "resnet$depth" -b "$batch" --threads "$threads" --steps "$steps" > "$tmp/old"
    echo "$config $(field median_step_s < "$tmp/ours") $(field rss_mb < "$tmp/ours") $(field median_step_s < "$tmp/old") $(field rss_mb < "$tmp/old")" >> "$tmp/rows"
    if [[ -n "$peer_python" ]]; then
      measure timeout 900 "$peer_python" "$peer" -a "resnet$depth" -b "$batch" --threads "$threads" --steps "$steps" \
        --format cl > "$tmp/new"
      echo "$config $(field median_step_s < "$tmp/new") $(field rss_mb < "$tmp/new")" >> "$tmp/modern"
    else
      echo "$config nan nan" >> "$tmp/modern"
    fi
  done
done
/usr/bin/python3 - "$tmp/rows" "$tmp/modern" "$configs" <<'PY'
import math, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
modern = [l.split() for l in open(sys.argv[2])]
print(f"{'threads':>7} {'batch':>5} {'ours_s':>8} {'torch2_s':>8} {'ratio2':>6} {'torch1.13_s':>11} {'ratio1.13':>9} "
      f"{'ours_rss_mb':>11} {'torch2_rss_mb':>13} {'torch1.13_rss_mb':>16}")
for config in sys.argv[3].split():
    mine = [r for r in rows if r[0] == config]
    new = [m for m in modern if m[0] == config]
    med = lambda xs: statistics.median(xs)
    ours, ours_rss = med([float(r[1]) for r in mine]), med([float(r[2]) for r in mine])
    old, old_rss = med([float(r[3]) for r in mine]), med([float(r[4]) for r in mine])
    # Ratios per round (interleaved), then the median.
    r_old = med([float(r[1]) / float(r[3]) for r in mine])
    t2 = [float(m[1]) for m in new]
    if all(math.isfinite(x) for x in t2):
        r_new = med([float(r[1]) / float(m[1]) for r, m in zip(mine, new)])
        new_s, new_rss = f"{med(t2):8.4f}", f"{med([float(m[2]) for m in new]):13.0f}"
        r_new_s = f"{r_new:6.2f}"
    else:
        new_s, new_rss, r_new_s = f"{'-':>8}", f"{'-':>13}", f"{'-':>6}"
    threads, batch = config.split(":")
    print(f"{threads:>7} {batch:>5} {ours:8.4f} {new_s} {r_new_s} {old:11.4f} {r_old:9.2f} {ours_rss:11.0f} {new_rss} {old_rss:16.0f}")
PY
