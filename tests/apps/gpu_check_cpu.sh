#!/usr/bin/env bash
# What of scripts/gpu_check.sh runs without a GPU: usage errors name the flag; a dry run finds the CUDA
# libraries, prints every command of the check and writes a JSON; a bundle with a missing or damaged
# package is refused before anything is unpacked; the unpacked prefix takes a library's headers and its
# binary from one place (scripts/gpu_prefix.sh); a full run on a machine without a GPU stops at once with
# the reason. (The build-only mode and the bundle's completeness are checked by hand: docs/GPU.md.)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
check=$repo/scripts/gpu_check.sh
export PYTHON=${PYTHON:-/usr/bin/python3} PATH=/usr/local/cuda/bin:$PATH
fails=0
expect() {  # expect STATUS PATTERN -- COMMAND...: COMMAND exits STATUS and prints PATTERN (grep -E)
  local want=$1 pattern=$2
  shift 3
  "$@" > "$work/out.txt" 2>&1
  local got=$?
  if [[ $got -ne $want ]] || ! grep -Eq -- "$pattern" "$work/out.txt"; then
    echo "FAIL: $* exited $got (wanted $want) and/or did not print /$pattern/:"; sed 's/^/  | /' "$work/out.txt" | tail -20
    fails=$((fails + 1))
  fi
}

expect 2 "give the results folder" -- bash "$check"
expect 2 "unknown option '--fast'" -- bash "$check" "$work/r" --fast
expect 2 "[-]-steps must be a positive whole number, got '0'" -- bash "$check" "$work/r" --steps 0
expect 2 "[-]-use-bundle must be auto, always, prefer-system or never, got 'maybe'" -- bash "$check" "$work/r" --use-bundle maybe
expect 2 "one results folder only" -- bash "$check" "$work/r" "$work/s"

if ! command -v nvcc > /dev/null; then
  expect 1 "no nvcc" -- bash "$check" "$work/r" --dry-run --build-dir "$work/b"
  echo "no nvcc here: the dry run's plan was not checked"
else
  expect 0 "dry run: found what the check needs" -- bash "$check" "$work/r" --dry-run --build-dir "$work/b"
  for step in "DRINGTRAIN_CUDA=ON" "DCMAKE_CUDA_ARCHITECTURES=" "tests/test_cuda_vs_cpu " "tests/test_cuda_conv " \
    "-np 2 .*tests/test_grad_sync .*GradSyncGpu" "-np 1 .*tests/test_comm .*GpuCollectives" \
    "train_resnet --synthetic -a resnet50 -b 256 --precision bf16 --device cuda --steps 30" \
    "train_resnet --synthetic -a resnet18" "torch_gpu_peer.py -a resnet50 -b 256 --steps 30 --precision bf16" \
    "torch_gpu_peer.py -a resnet50 .*--precision bf16 .*--profile-steps 5 --profile-json .*/peer_profile_resnet50_bf16.json" \
    "torch_gpu_peer.py -a resnet50 -b 256 --steps 20 --precision fp16 --tf32 on" \
    "torch_gpu_peer.py -a resnet50 -b 256 --steps 20 --precision fp32 --tf32 on" \
    "bench_step -a resnet18 .*--precision bf16 --steps 10 --warmup 3 --cuda-graph" \
    "-np 1 .*tests/test_runtime_mpi .*Trainer.CudaGraphStepsTrainLikeStepsRunOpByOp" \
    "train_resnet --synthetic -a resnet50 -b 256 --precision bf16 --device cuda --steps 30 --cuda-graph" \
    "make_shards synthetic .*--shape 350x400x3 --count 1536 .*--encode jpeg" \
    "train_resnet --data .*/jpeg -a resnet50 -b 256 --image-size 224 --precision bf16"; do
    grep -Eq -- "^\+ .*$step" "$work/r/gpu_check.log" || { echo "FAIL: the dry run's plan lacks /$step/"; fails=$((fails + 1)); }
  done
  # Most important first (a run that meets the end of --budget skips the tail): the tests, then ResNet-50
  # bf16 against the peer and as a graph, then fp16/fp32, then ResNet-18, then the memory plan and the input.
  order=("tests/test_cuda_vs_cpu " "train_resnet --synthetic -a resnet50 -b 256 --precision bf16 .*--profile"
    "torch_gpu_peer.py -a resnet50 -b 256 --steps 30 --precision bf16" "--precision bf16 --device cuda --steps 30 --cuda-graph"
    "bench_step -a resnet50 .*--precision fp16" "torch_gpu_peer.py -a resnet50 -b 256 --steps 20 --precision fp32"
    "train_resnet --synthetic -a resnet18" "-a resnet50 -b 128 --precision fp32" "--layout auto" "--encode jpeg")
  last=0
  for step in "${order[@]}"; do
    at=$(grep -nE -- "^\+ .*$step" "$work/r/gpu_check.log" | head -1 | cut -d: -f1)
    if [[ -z $at || $at -le $last ]]; then
      echo "FAIL: /$step/ is not where the order wants it (line ${at:-none}, after line $last)"; fails=$((fails + 1))
    fi
    last=${at:-$last}
  done
  expect 0 "the plan's estimated time on an H200: about [0-9]+ s \(--budget 360 s" -- \
    bash "$check" "$work/r" --dry-run --build-dir "$work/b"
  "$PYTHON" - "$work/r/gpu_check.json" <<'PY' || fails=$((fails + 1))
import json, sys
r = json.load(open(sys.argv[1]))
assert r["mode"] == "dry" and r["failed"] == [] and len(r["commands"]) >= 15, r
assert r["cudnn"]["version"].startswith("9.") and r["nccl"]["version"].count(".") == 2, r
assert "tests" not in r and "training" not in r, r
assert 300 <= r["planned_seconds"] <= 600, r["planned_seconds"]
PY
  # A bundle is checked against its MANIFEST before anything is unpacked.
  mkdir -p "$work/bundle"
  expect 1 "the bundle $work/bundle has no MANIFEST: make it with scripts/gpu_bundle.sh" -- \
    bash "$check" "$work/r" --dry-run --use-bundle always --bundle "$work/bundle" --build-dir "$work/b"
  echo "not a package" > "$work/bundle/libfoo1_1.0_amd64.deb"
  printf '# made today\nlibfoo1 1.0 %s\nlibbar2 2.0 %s\n' "$(printf '0%.0s' {1..64})" "$(printf '0%.0s' {1..64})" > "$work/bundle/MANIFEST"
  expect 1 "libfoo1_1.0_amd64.deb does not match its MANIFEST checksum" -- \
    bash "$check" "$work/r" --dry-run --use-bundle always --bundle "$work/bundle" --build-dir "$work/b"
  printf '# made today\nlibfoo1 1.0 %s\nlibbar2 2.0 %s\n' "$(sha256sum "$work/bundle/libfoo1_1.0_amd64.deb" | cut -d' ' -f1)" "$(printf '0%.0s' {1..64})" > "$work/bundle/MANIFEST"
  expect 1 "the bundle $work/bundle lacks libbar2 2.0" -- \
    bash "$check" "$work/r" --dry-run --use-bundle always --bundle "$work/bundle" --build-dir "$work/b"
fi

# The bundle's private prefix (scripts/gpu_prefix.sh), with made-up packages and a made-up machine: a
# library's headers come with its own binary. Where the machine has libjpeg's headers and link, the
# bundle's development files leave the prefix (the 2026-12-04 run compiled the bundle's jpeglib.h with the
# machine's jconfig.h, 80, and ran the bundle's libjpeg.so.62); where it lacks them, the bundle's headers
# stay with the bundle's own libjpeg.so.62, even though this machine's ldconfig knows that soname.
if command -v dpkg-deb > /dev/null; then
  fake_deb() {  # fake_deb PACKAGE ROOT: ROOT's files as $work/debs/PACKAGE_1_amd64.deb
    mkdir -p "$2/DEBIAN" "$work/debs"
    printf 'Package: %s\nVersion: 1\nArchitecture: amd64\nMaintainer: t <t@example.org>\nDescription: made up\n' "$1" > "$2/DEBIAN/control"
    dpkg-deb --build --root-owner-group "$2" "$work/debs/$1_1_amd64.deb" > /dev/null
  }
  a=x86_64-linux-gnu d=$work/pkg/dev r=$work/pkg/run m=$work/machine8
  mkdir -p "$d/usr/include/$a" "$d/usr/lib/$a/pkgconfig" "$r/usr/lib/$a" "$m/usr/include/$a" "$m/usr/lib/$a" "$work/bare"
  echo '#include "jconfig.h"' > "$d/usr/include/jpeglib.h"
  echo '#define JPEG_LIB_VERSION 62' > "$d/usr/include/$a/jconfig.h"
  ln -s libjpeg.so.62 "$d/usr/lib/$a/libjpeg.so"
  : > "$d/usr/lib/$a/libjpeg.a"; : > "$d/usr/lib/$a/pkgconfig/libjpeg.pc"
  fake_deb libjpeg62-turbo-dev "$d"
  : > "$r/usr/lib/$a/libjpeg.so.62.3.0"; ln -s libjpeg.so.62.3.0 "$r/usr/lib/$a/libjpeg.so.62"
  fake_deb libjpeg62-turbo "$r"
  cp "$d/usr/include/jpeglib.h" "$m/usr/include/"  # the machine: Ubuntu 24.04's libjpeg-turbo8-dev
  echo '#define JPEG_LIB_VERSION 80' > "$m/usr/include/$a/jconfig.h"
  : > "$m/usr/lib/$a/libjpeg.so.8"; ln -s libjpeg.so.8 "$m/usr/lib/$a/libjpeg.so"
  dev_files=(usr/include/jpeglib.h "usr/include/$a/jconfig.h" "usr/lib/$a/libjpeg.so" "usr/lib/$a/libjpeg.a" "usr/lib/$a/pkgconfig/libjpeg.pc")
  expect 0 "libjpeg62-turbo-dev: the machine's own headers and library \(the package's 5 files left out of the prefix\)" -- \
    env RINGTRAIN_MACHINE_ROOT="$m" bash "$repo/scripts/gpu_prefix.sh" "$work/prefix_machine" auto "$work"/debs/*.deb
  for f in "${dev_files[@]}"; do
    if [[ -e $work/prefix_machine/$f || -L $work/prefix_machine/$f ]]; then echo "FAIL: the bundle's $f stayed in the prefix"; fails=$((fails + 1)); fi
  done
  expect 0 "libjpeg62-turbo-dev: the bundle's headers with the bundle's own library \(the machine lacks /usr/include/jpeglib.h\)" -- \
    env RINGTRAIN_MACHINE_ROOT="$work/bare" bash "$repo/scripts/gpu_prefix.sh" "$work/prefix_bundle" prefer-system "$work"/debs/*.deb
  for f in "${dev_files[@]}" "usr/lib/$a/libjpeg.so.62"; do
    [[ -e $work/prefix_bundle/$f ]] || { echo "FAIL: the bundle's $f left the prefix"; fails=$((fails + 1)); }
  done
  [[ $(readlink -f "$work/prefix_bundle/usr/lib/$a/libjpeg.so") = "$work/prefix_bundle/usr/lib/$a/libjpeg.so.62.3.0" ]] ||
    { echo "FAIL: the bundle's libjpeg.so leads to $(readlink -f "$work/prefix_bundle/usr/lib/$a/libjpeg.so")"; fails=$((fails + 1)); }
  ldconfig -p | grep -q "libjpeg\.so\.62 " || echo "this machine's ldconfig knows no libjpeg.so.62: keeping the bundle's despite a known soname was not exercised"
else
  echo "no dpkg-deb here: the bundle's prefix was not checked"
fi

if command -v nvidia-smi > /dev/null && nvidia-smi > /dev/null 2>&1; then
  echo "a GPU is here: the no-GPU refusal was not checked"
else
  expect 1 "no NVIDIA GPU here .*--build-only or --dry-run" -- bash "$check" "$work/r" --build-dir "$work/b"
fi
((fails == 0)) && echo "gpu_check_cpu: all cases behave"
exit $((fails > 0))
