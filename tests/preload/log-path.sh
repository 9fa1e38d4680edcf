#!/usr/bin/env bash
# log-path.sh: a double free under QMALLOC_OPTIONS=log_path=DIR/qm must write
# its report to DIR/qm.<pid> as well as stderr, byte for byte the same, where
# pid is the process's (the report's "freed by thread" of the main thread).
# usage: log-path.sh LIB PROG
set -uo pipefail
lib=$1 prog=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# shellcheck source=preloaded.sh
. "$(dirname "$0")/preloaded.sh"
preload_prefix "$lib"
QMALLOC_OPTIONS=log_path=$dir/qm "${PRE[@]}" "$prog" double-free 131072 2>"$dir/stderr" >/dev/null
rc=$?
drop_emulator_lines "$dir/stderr"
fail() { echo "FAIL: $*" >&2; ls -l "$dir" >&2; cat "$dir"/* >&2; exit 1; }
[ "$rc" -eq $((128 + 6)) ] || fail "expected SIGABRT, got $rc"
shopt -s nullglob
logs=("$dir"/qm.*)
[ ${#logs[@]} -eq 1 ] || fail "expected one log file, found ${#logs[@]}"
pid=${logs[0]##*.}
[[ $pid =~ ^[0-9]+$ ]] || fail "log file name does not end in a pid: ${logs[0]}"
grep -Eq "^  freed by thread $pid, " "${logs[0]}" || fail "log does not hold the report of pid $pid"
cmp -s "${logs[0]}" "$dir/stderr" || fail "log and stderr differ"
echo "ok: report in ${logs[0]##*/}, same as stderr"
