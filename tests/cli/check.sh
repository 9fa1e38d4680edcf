#!/usr/bin/env bash
# check.sh: the README's commands from another directory than the checkout:
# `qmalloc run -- CMD` runs CMD in the caller's directory, `qmalloc run` (the
# demo) and `qmalloc probe` work from there, `qmalloc symbolize FILE` takes a
# path relative to it, and a missing file is one line, not a traceback.
# usage: check.sh QMALLOC BUILD_DIR
set -uo pipefail
qm=$1
export QMALLOC_BUILD_DIR=$2
unset CI # no reconfiguring of the build directory under test
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
here=$(pwd -P)
fail() { echo "FAIL: $*" >&2; exit 1; }

got=$("$qm" run -- pwd -P 2>"$dir/err") || fail "run -- pwd failed: $(cat "$dir/err")"
[ "$got" = "$here" ] || fail "run -- pwd printed '$got', not the caller's directory $here"
touch marker
"$qm" run -- test -f marker 2>/dev/null || fail "run -- CMD does not see the caller's files"
"$qm" run -- sh -c 'case "$LD_PRELOAD" in */libqmalloc.so*) exit 0 ;; *) exit 1 ;; esac' ||
  fail "run -- CMD does not preload libqmalloc.so"
"$qm" run >/dev/null 2>&1 || fail "run (the demo) failed from another directory"
"$qm" probe --json --quick >probe.json 2>/dev/null || fail "probe failed from another directory"
grep -q '"strategy"' probe.json || fail "probe --json printed no strategy"

printf 'qmalloc: ERROR: something\n    #0 0x1234 (/nonexistent/module+0x10)\n' >report.txt
"$qm" symbolize report.txt >sym.txt 2>"$dir/err" || fail "symbolize report.txt failed: $(cat "$dir/err")"
cmp -s report.txt sym.txt || fail "symbolize changed lines it cannot resolve: $(cat sym.txt)"
"$qm" symbolize missing.txt >/dev/null 2>"$dir/err" && fail "symbolize of a missing file succeeded"
[ "$(wc -l <"$dir/err")" -eq 1 ] || fail "a missing file is not one line: $(cat "$dir/err")"
grep -qx 'qmalloc-symbolize: missing.txt: No such file or directory' "$dir/err" ||
  fail "unexpected error for a missing file: $(cat "$dir/err")"
echo "ok: run, probe and symbolize from $here"
