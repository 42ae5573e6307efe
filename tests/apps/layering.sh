#!/usr/bin/env bash
# layering.sh SOURCE_DIR: every floor includes only its own headers and those of the floors below it
# (core; io, optim and layers; data; comm; runtime; apps), as docs/ARCHITECTURE.md draws them. Prints each
# violation. The runtime's areas are checked the same way among themselves.
set -euo pipefail
src=$1
declare -A allowed=(
  [core]="core"
  [io]="core io"
  [optim]="core optim"
  [layers]="core layers"
  [data]="core io data"
  [comm]="core optim layers comm"
  [runtime]="core io optim data layers comm runtime"
)
bad=0
for floor in core io optim layers data comm runtime; do
  while IFS= read -r line; do
    file=${line%%:*}
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<< "$line")
    if [[ " ${allowed[$floor]} " != *" $target "* ]]; then
      echo "layering: $line (the $floor floor may include only: ${allowed[$floor]})"
      bad=1
    fi
  done < <(grep -rnE '^#include "[a-z_]+/' "$src/$floor" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
done
# The runtime's areas (runtime/CMakeLists.txt): each includes only runtime/types.h, its own headers and those
# of the areas below it.
declare -A area_allowed=(
  [cluster]="cluster"
  [config]="cluster config"
  [telemetry]="cluster config telemetry"
  [checkpoint]="cluster config checkpoint"
  [step]="cluster config telemetry checkpoint step"
  [memory]="cluster config step memory"
  [pipeline]="cluster config telemetry step pipeline"
  [layout]="cluster config telemetry step memory pipeline layout"
  [loop]="cluster config telemetry checkpoint step memory pipeline layout loop"
  [tools]="tools"
)
for area in "${!area_allowed[@]}"; do
  [[ -d $src/runtime/$area ]] || { echo "layering: runtime/$area is missing"; bad=1; continue; }
  while IFS= read -r line; do
    target=$(sed -E 's/.*#include "runtime\/([a-z_.]+).*/\1/' <<< "$line")
    [[ $target == types.h ]] && continue
    if [[ " ${area_allowed[$area]} " != *" $target "* ]]; then
      echo "layering: $line (runtime/$area may include only runtime/types.h and: ${area_allowed[$area]})"
      bad=1
    fi
  done < <(grep -rnE '^#include "runtime/' "$src/runtime/$area" --include='*.h' --include='*.cpp' || true)
done
for f in "$src"/runtime/*.h "$src"/runtime/*.cpp; do
  [[ -e $f && $(basename "$f") != types.h ]] && { echo "layering: $f is outside the runtime's areas"; bad=1; }
done
if (( bad )); then exit 1; fi
echo "layering ok"
