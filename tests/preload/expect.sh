#!/usr/bin/env bash
# expect.sh: runs a command with libqmalloc preloaded and checks how it ends
# (exit 0, SEGV or ABRT) and that its stderr matches a regex, line-anchored.
# usage: expect.sh LIB 0|SEGV|ABRT REGEX [VAR=VALUE...] -- CMD [ARGS...]
# A REGEX of "-" means stderr must be empty. A command that exits 77 could
# not be put in the state it tests: skipped (meson's 77), its stderr says why.
set -uo pipefail
lib=$1 want=$2 regex=$3
shift 3
envs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
shift
err=$(mktemp)
trap 'rm -f "$err"' EXIT
env "${envs[@]}" LD_PRELOAD="$lib" "$@" 2>"$err" >/dev/null
rc=$?
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
if [ "$ok" -ne 1 ]; then
  echo "FAIL: expected $want, got exit status $rc; stderr:" >&2
  cat "$err" >&2
  exit 1
fi
if [ "$regex" = "-" ]; then
  if [ -s "$err" ]; then
    echo "FAIL: stderr should be empty:" >&2
    cat "$err" >&2
    exit 1
  fi
elif ! grep -Eq -- "$regex" "$err"; then
  echo "FAIL: stderr does not match /$regex/:" >&2
  cat "$err" >&2
  exit 1
fi
echo "ok: $want, stderr matches"
