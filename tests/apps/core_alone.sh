#!/usr/bin/env bash
# core_alone.sh PROGRAM...: the core's test programs (the tensor library and its tests) link neither MPI
# nor HDF5. Prints each program that does, with the libraries; "core alone: N test programs" when none.
set -euo pipefail
bad=0
for program in "$@"; do
  libs=$(ldd "$program")
  found=$(grep -oE 'lib(mpi|open-pal|open-rte|hdf5)[^ ]*' <<< "$libs" | sort -u | tr '\n' ' ' || true)
  if [[ -n $found ]]; then
    echo "core alone: $(basename "$program") links $found"
    bad=1
  fi
done
(( bad )) && exit 1
echo "core alone: $# test programs link neither MPI nor HDF5"
