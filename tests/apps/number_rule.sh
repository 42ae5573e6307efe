#!/usr/bin/env bash
# tests/apps/number_rule.sh SOURCE_DIR: every number ringtrain reads from text goes through core/parse.h's
# one rule (the whole text, decimal, in range, nothing wrapped or truncated). Fails naming each place that
# calls the C or C++ library's own conversions (atoi, strtol, stoll, stod, ...), which accept "12abc",
# " 12", "0x10" or wrap silently.
set -uo pipefail
src=$(cd "$1" && pwd)
cd "$src"
calls='\b(std::)?(atoi|atol|atoll|atof|strtol|strtoll|strtoul|strtoull|strtod|strtof|stoi|stol|stoll|stoul|stoull|stod|stof|stold|sscanf)\s*\('
found=$(grep -rnE "$calls" core io optim layers data comm runtime apps tests --include='*.cpp' --include='*.h' --include='*.cu' |
  grep -vE '^core/parse\.(h|cpp):' | grep -vE ':\s*//')
if [[ -n $found ]]; then
  echo "number rule: read without core/parse.h:"
  echo "$found" | sed 's/^/  /'
  exit 1
fi
# The pattern must still find what it looks for.
for sample in 'n = std::stoll(text);' 'v = atoi(p);' 'x = std::strtod(s, &end);'; do
  grep -qE "$calls" <<< "$sample" || { echo "number rule: the pattern misses '$sample': it is stale"; exit 1; }
done
echo "number rule: ok (every number from text through core/parse.h)"
