#!/usr/bin/env bash
# help.sh LIB OPTIONS_DEF PROG: help=1 lists every option of options.def with
# the value in force (guard_interval_kb=100 under hardening=max runs as 256),
# its range and default, and ends the program with status 0 before main
# (PROG, run without arguments, would print its usage and exit 2); verbose=1
# prints the values in force too. PROG is the suite's own program, linked
# dynamically: a system tool may be a static binary that LD_PRELOAD cannot
# reach (busybox's echo and true in a minimal guest).
set -uo pipefail
lib=$1 def=$2 prog=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
err=$(mktemp) out=$(mktemp)
trap 'rm -f "$err" "$out"' EXIT
# shellcheck source=preloaded.sh
. "$(dirname "$0")/preloaded.sh"
preload_prefix "$lib"
QMALLOC_OPTIONS=help=1:guard_interval_kb=100:hardening=max "${PRE[@]}" "$prog" >"$out" 2>"$err"
rc=$?
grep -q '^usage: prog' "$err" && fail "help=1: the program ran (its usage line was printed)"
[ $rc -eq 0 ] || fail "help=1: exit status $rc"
[ ! -s "$out" ] || fail "help=1: the program wrote: $(cat "$out")"
head -1 "$err" | grep -q '^qmalloc: QMALLOC_OPTIONS="name=value:name=value"; every option' || fail "no heading: $(head -1 "$err")"
names=$(sed -n 's/^QM_OPT(\([a-z_0-9]*\),.*/\1/p' "$def")
[ "$(echo "$names" | wc -l)" -gt 20 ] || fail "read no options from $def"
for n in $names; do
  grep -q "^  $n=" "$err" || fail "help=1 does not list $n"
done
grep -qx '  guard_interval_kb=256' "$err" || fail "guard_interval_kb not shown as in force (256)"
grep -qx '  hardening=max' "$err" || fail "hardening not max"
grep -qx '      0\.\.1048576, default 1024: an inaccessible page ends every span .*' "$err" || fail "no range and default for guard_interval_kb"
QMALLOC_OPTIONS=verbose=1:guard_interval_kb=100 "${PRE[@]}" "$prog" 2>"$err"
grep -q '^qmalloc: option guard_interval_kb=256 ' "$err" || fail "verbose=1: guard_interval_kb not 256: $(cat "$err")"
echo "ok: help=1 lists $(echo "$names" | wc -l) options and exits 0; verbose shows values in force"
