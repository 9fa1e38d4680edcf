#!/usr/bin/env bash
# check_bugs.sh: runs bugs_named (one planted bug) and checks that the
# report's first frame and its SUMMARY blame the program's own function FN:
# raw, the SUMMARY names the program's module; symbolized with SYMBOLIZE (or
# as `qmalloc run` prints it with --run QMALLOC), the first frame and the
# SUMMARY both read "in FN".
# usage: check_bugs.sh SYMBOLIZE MODE FN [--run QMALLOC] [VAR=VALUE...] -- CMD
set -uo pipefail
symbolize=$1 mode=$2 fn=$3
shift 3
run=
if [ "${1:-}" = --run ]; then run=$2; shift 2; fi
envs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if [ -n "$run" ]; then
  env "${envs[@]}" "$run" run -- "$@" "$mode" 2>"$dir/sym" >/dev/null
else
  env "${envs[@]}" "$@" "$mode" 2>"$dir/report" >/dev/null
fi
rc=$?
fail() {
  echo "FAIL ($mode): $*" >&2
  for f in report sym; do [ -f "$dir/$f" ] && { echo "--- $f:" >&2; cat "$dir/$f" >&2; }; done
  exit 1
}
[ "$rc" -gt 128 ] || fail "expected a death by a signal, got exit status $rc"
if [ -z "$run" ]; then
  # shellcheck source=../report.re
  . "$(dirname "$0")/../report.re"
  exe=$(readlink -f "${*: -1}")
  tail -n 1 "$dir/report" | grep -Fq "($exe+0x" || fail "the raw SUMMARY does not name $exe"
  tail -n 2 "$dir/report" | head -n 1 | grep -Eqx -- "$QM_HINT" || fail "no hint before SUMMARY"
  "$symbolize" "$dir/report" >"$dir/sym" || fail "symbolize failed"
  grep -Eq -- "$QM_HINT" "$dir/sym" && fail "the symbolized report still has the hint"
fi
first=$(grep -m1 -E '^    #[0-9]+ ' "$dir/sym")
echo "$first" | grep -Eq "^    #0 0x[0-9a-f]+ in $fn " || fail "the first frame is not $fn: $first"
tail -n 1 "$dir/sym" | grep -Eq "^SUMMARY: qmalloc: .* in $fn " || fail "SUMMARY does not blame $fn"
echo "ok ($mode): the first frame and SUMMARY blame $fn"
