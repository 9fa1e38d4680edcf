#!/usr/bin/env bash
# expect.sh: runs a command with libqmalloc preloaded and checks how it ends
# (exit 0, SEGV or ABRT) and that its stderr matches a regex, line-anchored.
# usage: expect.sh LIB 0|SEGV|ABRT REGEX [VAR=VALUE...] -- CMD [ARGS...]
# A REGEX of "-" means stderr must be empty. A command that exits 77 could
# not be put in the state it tests: skipped (meson's 77), its stderr says why.
# Three VAR=VALUE are expect.sh's own, not the command's: REPORT_KIND=K (a
# regex of the kind's words) checks the whole report against the one
# definition of the format, tests/report.re: the line REGEX matched is
# followed by the stack of the call (ABRT) or access (SEGV) that found the
# error, and the last line is SUMMARY naming kind K and, with
# REPORT_FRAME=FN, the function FN of the program as the offending frame.
# SKIP_EMULATED=REASON skips the test under qemu-user (QMT_EMULATED), saying
# why it means nothing there.
set -uo pipefail
# shellcheck source=preloaded.sh
. "$(dirname "$0")/preloaded.sh"
lib=$1 want=$2 regex=$3
shift 3
envs=()
kind='' frame=''
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    REPORT_KIND=*) kind=${1#REPORT_KIND=} ;;
    REPORT_FRAME=*) frame=${1#REPORT_FRAME=} ;;
    SKIP_EMULATED=*) skip_emulated "${1#SKIP_EMULATED=}" ;;
    *) envs+=("$1") ;;
  esac
  shift
done
shift
err=$(mktemp)
trap 'rm -f "$err"' EXIT
preload_prefix "$lib"
env "${envs[@]}" "${PRE[@]}" "$@" 2>"$err" >/dev/null
rc=$?
drop_emulator_lines "$err"
if [ "$rc" -eq 77 ]; then
  cat "$err"
  exit 77
fi
case $want in
  0) ok=$((rc == 0)) ;;
  SEGV) ok=$((rc == 128 + 11)) ;;
  ABRT) ok=$((rc == 128 + 6)) ;;
  *) echo "expect.sh: bad expectation $want" >&2; exit 2 ;;
esac
fail() {
  echo "FAIL: $1; stderr:" >&2
  cat "$err" >&2
  exit 1
}
[ "$ok" -eq 1 ] || fail "expected $want, got exit status $rc"
if [ "$regex" = "-" ]; then
  [ -s "$err" ] && fail "stderr should be empty"
elif ! grep -Eq -- "$regex" "$err"; then
  fail "stderr does not match /$regex/"
fi
if [ -n "$kind" ]; then
  # shellcheck source=../report.re
  . "$(dirname "$0")/../report.re"
  head=$QM_CALL_HEAD
  [ "$want" = SEGV ] && head=$QM_ACCESS_HEAD
  summary=${QM_SUMMARY_OF//@KIND@/$kind}
  if [ -n "$frame" ]; then
    summary=${QM_SUMMARY_AT//@KIND@/$kind}
    summary=${summary//@FN@/$frame}
  fi
  # the first line, the heading right after it, at least one frame; SUMMARY last
  n=$(grep -nE -m1 -- "$regex" "$err" | cut -d: -f1)
  # (a small overflow found after its free names that free first)
  sed -n "$((n + 1))p" "$err" | grep -Eqx -- "$head|$QM_SMALL_FREED_HEAD" ||
    fail "line $((n + 1)) is not /$head/"
  sed -n "$((n + 2))p" "$err" | grep -Eqx -- "$QM_FRAME" ||
    fail "line $((n + 2)) is not a frame /$QM_FRAME/"
  tail -n 1 "$err" | grep -Eqx -- "$summary" || fail "the last line is not /$summary/"
  tail -n 2 "$err" | head -n 1 | grep -Eqx -- "$QM_HINT" ||
    fail "the line before SUMMARY is not the symbolizer's hint /$QM_HINT/"
fi
echo "ok: $want, stderr matches"
