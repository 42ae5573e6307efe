#!/usr/bin/env bash
# scripts/bench_vs_pytorch.sh: CPU training-step time of ringtrain's models against PyTorch's in the same
# run, for each model, thread count and batch size, with the ratios ringtrain / PyTorch (below 1: ringtrain is
# faster) and every program's peak RSS. The peer is scripts/peers/torch_resnet_step.py (the same network, SGD
# step and batch: the ResNets of scripts/peers/models.py, torchvision's MobileNetV2 / EfficientNet / ConvNeXt, the
# UNet of scripts/make_goldens.py): run by Debian's PyTorch 1.13 (NCHW eager) and, when PEER_PYTHON names its
# interpreter (default /opt/torch2/bin/python if it exists), by a modern PyTorch from PyPI (channels_last eager:
# the fastest CPU training mode measured; make it with
#   python3 -m venv /opt/torch2 && /opt/torch2/bin/pip install torch==2.15.0 numpy
# about 5.5 GB, for benchmarks only; the torchvision models need torchvision and pillow beside it too:
#   /opt/torch2/bin/pip install --no-deps torchvision==0.29.2 && /opt/torch2/bin/pip install pillow).
# ROUNDS interleaved rounds (default 3), medians reported; each ratio is taken within its round.
# Usage: scripts/bench_vs_pytorch.sh [ARCH_DEPTH=20] [STEPS=5]   (BUILD_DIR: default build;
#        CONFIGS: default "1:32 1:128 2:32 2:128", threads:batch pairs;
#        ARCHS: models of the zoo instead of resnet$ARCH_DEPTH, e.g.
#          ARCHS="mobilenet_v2 efficientnet_b0 convnext_tiny unet" HW=64 CONFIGS="1:32 2:32" OLD_PEER=0;
#        HW: the image side (default: 32 for the CIFAR ResNets, 224 for the others);
#        OLD_PEER=0: without PyTorch 1.13; PROFILE=1: then each model's per-op-family --profile table at
#        PROFILE_THREADS (default 1) threads and the first configuration's batch)
set -euo pipefail
cd "$(dirname "$0")/.."
depth=${1:-20}
steps=${2:-5}
build=${BUILD_DIR:-build}
rounds=${ROUNDS:-3}
configs=${CONFIGS:-"1:32 1:128 2:32 2:128"}
archs=${ARCHS:-resnet$depth}
hw=${HW:-}
old_peer=${OLD_PEER:-1}
peer=scripts/peers/torch_resnet_step.py
peer_python=${PEER_PYTHON:-}
[[ -z "$peer_python" && -x /opt/torch2/bin/python ]] && peer_python=/opt/torch2/bin/python
[[ -x "$build/bench_step" ]] || { echo "$build/bench_step missing: run scripts/setup.sh" >&2; exit 1; }
[[ $old_peer == 1 || -n "$peer_python" ]] || { echo "OLD_PEER=0 and no PEER_PYTHON: no peer to compare with" >&2; exit 1; }
echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $archs ${hw:+${hw}x${hw} }fp32 SGD, $rounds interleaved rounds"
[[ -n "$peer_python" ]] && echo "== modern peer: $("$peer_python" -c 'import torch; print("torch", torch.__version__)')"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Runs a command under GNU time; prints its output line, then "rss_mb=..." (peak resident set).
measure() {
  /usr/bin/time -f "rss_kb=%M" -o "$tmp/time" "$@"
  echo "rss_mb=$(( $(sed -n 's/rss_kb=//p' "$tmp/time") / 1024 ))"
}
field() {  # NAME: its number in the line on stdin, or nan
  local v
  v=$(sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | head -1)
  echo "${v:-nan}"
}
classes_of() { [[ $1 == unet* ]] && echo 4 || echo 10; }  # a UNet's classes per pixel
for round in $(seq "$rounds"); do
  for arch in $archs; do
    for config in $configs; do
      threads=${config%:*}; batch=${config#*:}
      args=(-a "$arch" -b "$batch" --threads "$threads" --steps "$steps" --classes "$(classes_of "$arch")" ${hw:+--hw "$hw"})
      measure timeout 900 "$build/bench_step" "${args[@]}" > "$tmp/ours"
      if [[ $old_peer == 1 ]]; then
        measure timeout 900 /usr/bin/python3 "$peer" "${args[@]}" > "$tmp/old" 2> "$tmp/old.err" ||
          { cat "$tmp/old.err" >&2; exit 1; }
      else
        printf 'median_step_s=nan rss_mb=nan\n' > "$tmp/old"
      fi
      if [[ -n "$peer_python" ]]; then
        measure timeout 900 "$peer_python" "$peer" "${args[@]}" --format cl > "$tmp/new" 2> "$tmp/new.err" ||
          { cat "$tmp/new.err" >&2; exit 1; }
      else
        printf 'median_step_s=nan rss_mb=nan\n' > "$tmp/new"
      fi
      echo "$arch $config $(field median_step_s < "$tmp/ours") $(field rss_mb < "$tmp/ours")" \
        "$(field median_step_s < "$tmp/old") $(field rss_mb < "$tmp/old")" \
        "$(field median_step_s < "$tmp/new") $(field rss_mb < "$tmp/new")" >> "$tmp/rows"
    done
  done
done
/usr/bin/python3 - "$tmp/rows" "$archs" "$configs" <<'PY'
import math, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = statistics.median
print(f"{'model':>15} {'threads':>7} {'batch':>5} {'ours_s':>8} {'torch2_s':>8} {'ratio2':>6} {'torch1.13_s':>11} "
      f"{'ratio1.13':>9} {'ours_rss_mb':>11} {'torch2_rss_mb':>13} {'torch1.13_rss_mb':>16}")
for arch in sys.argv[2].split():
    for config in sys.argv[3].split():
        mine = [[float(x) if x not in ("", "nan") else math.nan for x in r[2:]] for r in rows
                if r[0] == arch and r[1] == config]
        ours, ours_rss, old, old_rss, new, new_rss = [med([r[i] for r in mine]) for i in range(6)]
        # Ratios per round (interleaved), then the median.
        r_old = med([r[0] / r[2] for r in mine])
        r_new = med([r[0] / r[4] for r in mine])
        num = lambda x, w, f: f"{x:{w}{f}}" if math.isfinite(x) else f"{'-':>{w}}"
        threads, batch = config.split(":")
        print(f"{arch:>15} {threads:>7} {batch:>5} {ours:8.4f} {num(new, 8, '.4f')} {num(r_new, 6, '.2f')} "
              f"{num(old, 11, '.4f')} {num(r_old, 9, '.2f')} {ours_rss:11.0f} {num(new_rss, 13, '.0f')} "
              f"{num(old_rss, 16, '.0f')}")
PY
if [[ ${PROFILE:-0} == 1 ]]; then
  first=${configs%% *}; batch=${first#*:}
  for arch in $archs; do
    echo "== --profile: $arch b$batch ${hw:+${hw}x${hw} }threads=${PROFILE_THREADS:-1}"
    timeout 900 "$build/bench_step" -a "$arch" -b "$batch" --threads "${PROFILE_THREADS:-1}" --steps 1 --warmup 1 \
      --classes "$(classes_of "$arch")" ${hw:+--hw "$hw"} --profile
  done
fi
