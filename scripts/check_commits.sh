#!/usr/bin/env bash
# scripts/check_commits.sh [BASE]: every commit after BASE has a subject of at most 72 characters and, when
# it has a body, a blank line between them (the why goes in the body). BASE defaults to the commit
# before the rule was adopted; a clone without it (a shallow one) checks HEAD's own commit only. .ci/run
# runs it; .githooks/commit-msg applies the same rule to a message before it is committed (scripts/setup.sh
# points git at .githooks).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-a4fee7c}
if ! git rev-parse --git-dir > /dev/null 2>&1; then
  echo "check_commits: not a git checkout; nothing to check"
  exit 0
fi
if git cat-file -e "$base^{commit}" 2> /dev/null; then
  range="$base..HEAD"
else
  echo "check_commits: $base is not in this clone; checking HEAD only"
  range="HEAD^!"
fi
bad=0 count=0
while IFS= read -r sha; do
  count=$((count + 1))
  subject=$(git log -1 --format=%s "$sha")
  second=$(git log -1 --format=%B "$sha" | sed -n 2p)
  if (( ${#subject} > 72 )); then
    echo "check_commits: ${sha:0:7} subject has ${#subject} characters (at most 72): $subject"
    bad=1
  fi
  if [[ -n $second ]]; then
    echo "check_commits: ${sha:0:7} has no blank line between its subject and its body"
    bad=1
  fi
done < <(git rev-list --no-merges "$range")
(( bad )) && exit 1
echo "check_commits: $count commit(s) since $base keep subjects at 72 characters or less"
