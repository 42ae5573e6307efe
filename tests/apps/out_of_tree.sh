#!/usr/bin/env bash
# out_of_tree.sh BUILD_DIR WORK_DIR SOURCE_DIR [extra cmake args]: installs BUILD_DIR into a private
# prefix, builds apps/examples/out_of_tree against it with find_package(ringtrain), and trains the custom
# model for an epoch on 2 ranks with the installed make_shards' data.
set -euo pipefail
build=$1; work=$2; src=$3; shift 3
rm -rf "$work"; mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
# The package must not point back into the source or build tree (it has to work once those are gone).
if grep -rl -e "$src/" -e "$build/" "$work/prefix/lib/cmake/ringtrain"; then
  echo "installed CMake package refers to the source or build tree" >&2; exit 1
fi
test -f "$work/prefix/include/ringtrain/comm/grad_sync.h"
cmake -S "$src/apps/examples/out_of_tree" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" "$@" > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
grep "ringtrain .* from $work/prefix" "$work/configure.log"
cmake --build "$work/build" -j 2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/prefix/bin/make_shards" synthetic "$work/data" --shape 12x12x3 --count 256 --classes 4 --shards 2 > /dev/null
mpirun -np 2 --allow-run-as-root --oversubscribe "$work/build/custom_model" --data "$work/data" --epochs 1 -b 16
echo "out-of-tree build ran"
