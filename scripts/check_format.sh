#!/usr/bin/env bash
# scripts/check_format.sh [--fix]: every C, C++ and CUDA source git tracks is laid out as .clang-format says
# (column limit 120, Google style). Prints the files that are not, with the first differences, and exits
# non-zero; --fix rewrites them in place instead. CI runs the check (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format > /dev/null || { echo "check_format: clang-format missing (scripts/setup.sh installs it)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.c' '*.cpp' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" > /dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]})); then
  for f in "${bad[@]}"; do
    echo "check_format: $f is not laid out as .clang-format says:"
    diff <(cat "$f") <(clang-format "$f") | head -8 || true
  done
  echo "check_format: ${#bad[@]} of ${#files[@]} files differ; run 'bash scripts/check_format.sh --fix'" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files follow .clang-format ($(clang-format --version | sed 's/.*version //'))"
