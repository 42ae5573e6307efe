#!/usr/bin/env bash
# flags_doc.sh SOURCE_DIR BUILD_DIR: docs/FLAGS.md is what scripts/flags_doc.sh prints for this build.
set -euo pipefail
src=$1 build=$2
if ! diff -u "$src/docs/FLAGS.md" <(bash "$src/scripts/flags_doc.sh" "$build"); then
  echo "flags_doc: docs/FLAGS.md is out of date: run 'bash scripts/flags_doc.sh build > docs/FLAGS.md'" >&2
  exit 1
fi
echo "flags_doc: docs/FLAGS.md is current"
