#!/usr/bin/env bash
# expect_abort.sh DEADLINE_S COMMAND...: runs COMMAND (an mpirun job in which a rank fails) and passes
# when it exits non-zero within DEADLINE_S seconds; prints the job's output for CTest's regex checks.
deadline=$1
shift
start=$(date +%s)
output=$(timeout --kill-after=5 "$deadline" "$@" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$output"
echo "expect_abort: exit status $rc after ${elapsed}s"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "expect_abort: FAIL: the job hung past the ${deadline}s deadline"
  exit 1
fi
if [ "$rc" -eq 0 ]; then
  echo "expect_abort: FAIL: the job exited 0 although a rank failed"
  exit 1
fi
echo "expect_abort: ended promptly with a failure status"
