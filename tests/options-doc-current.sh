#!/bin/sh
# options-doc-current.sh GEN OPTIONS_DEF DOC: docs/options.md is what
# tools/gen-options-doc.py writes from src/platform/options.def today, so the options
# reference cannot drift from the parser. Regenerates to a temp file, diffs.
set -eu
gen=$1 def=$2 doc=$3
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
python3 "$gen" "$def" "$tmp"
if ! diff -u "$doc" "$tmp"; then
  echo "$doc is out of date with $def: run tools/gen-options-doc.py and commit docs/options.md"
  exit 1
fi
echo "ok: $doc matches $def ($(grep -c '^| `' "$doc") options)"
