#!/usr/bin/env bash
# scripts/test.sh: builds build/ if needed (via scripts/setup.sh) and runs the whole CTest suite,
# printing failing tests' output in full. Extra arguments go to ctest (e.g. -R Golden).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  bash scripts/setup.sh
else
  cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"
fi
# Open MPI refuses root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$build_dir"
status=0
ctest --output-on-failure -j "${JOBS:-$(nproc)}" "$@" || status=$?
# Skipped tests print their reason only in the log; show each distinct reason once.
if [[ -f Testing/Temporary/LastTest.log ]]; then
  grep -hA1 ': Skipped$' Testing/Temporary/LastTest.log | grep -v -e ': Skipped$' -e '^--$' |
    sort | uniq -c | sed 's/^ */skip reason: /' || true
fi
exit $status
