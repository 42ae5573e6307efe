#!/usr/bin/env bash
# layering.sh SOURCE_DIR: every floor includes only its own headers and those of the floors below it
# (core; io, optim and layers; data; comm; runtime; apps), as docs/ARCHITECTURE.md draws them. Prints each
# violation.
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
if (( bad )); then exit 1; fi
echo "layering ok"
