#!/usr/bin/env bash
# tests/apps/env_rule.sh SOURCE_DIR: every RINGTRAIN_* variable is read through core/env.h (one rule for
# switches and numbers), listed in docs/ENVIRONMENT.md and in core/env.cpp's table that checks them all at a
# program's start and holds each switch's meaning and default and each number's range (ringtrain_switch,
# ringtrain_number). Fails naming the file that reads one itself, or the variable a list lacks.
set -uo pipefail
src=$(cd "$1" && pwd)
cd "$src"
fails=0
dirs=(core io optim layers data comm runtime apps)
# 1. Nobody but core/env.cpp calls getenv on a RINGTRAIN_ (or the old RT_) name.
direct=$(grep -rnE 'getenv\("(RINGTRAIN|RT)_' "${dirs[@]}" --include='*.cpp' --include='*.h' --include='*.cu' |
  grep -v '^core/env\.cpp:')
if [[ -n $direct ]]; then
  echo "env rule: read without core/env.h:"; echo "$direct" | sed 's/^/  /'; fails=$((fails + 1))
fi
# 2. Every variable read through core/env.h is on the page.
read_names=$(grep -rhoE '(env_text|env_switch|env_number<[a-z0-9_]+>|ringtrain_switch|ringtrain_number)\("RINGTRAIN_[A-Z0-9_]+"' "${dirs[@]}" \
  --include='*.cpp' --include='*.h' --include='*.cu' | grep -oE 'RINGTRAIN_[A-Z0-9_]+' | sort -u)
count=$(wc -w <<< "$read_names")
((count >= 15)) || { echo "env rule: only $count variables found read through core/env.h: the pattern is stale"; fails=$((fails + 1)); }
for name in $read_names; do
  grep -q "\`$name\`" docs/ENVIRONMENT.md || { echo "env rule: $name is read but not in docs/ENVIRONMENT.md"; fails=$((fails + 1)); }
done
# 3. Every variable read, and every one on the page's tables, is in core/env.cpp's table, which checks them all
#    at each program's start (check_environment): one of the three lists cannot grow alone.
table=$(sed -n '/^constexpr Variable kVariables/,/^};/p' core/env.cpp | grep -oE '"RINGTRAIN_[A-Z0-9_]+"' | tr -d '"' | sort -u)
page=$(grep -oE '^\| `RINGTRAIN_[A-Z0-9_]+`' docs/ENVIRONMENT.md | grep -oE 'RINGTRAIN_[A-Z0-9_]+' | sort -u)
for name in $read_names $page; do
  grep -qx "$name" <<< "$table" || { echo "env rule: $name is not in core/env.cpp's kVariables"; fails=$((fails + 1)); }
done
((fails == 0)) && echo "env rule: ok ($count variables, all through core/env.h and documented)"
exit $((fails > 0))
