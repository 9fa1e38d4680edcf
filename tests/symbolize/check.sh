#!/usr/bin/env bash
# check.sh: runs a -g program that frees a large buffer in a named function
# and then writes to it; checks that it dies of SIGSEGV, that the report has
# the access, free and allocation stacks, and that qmalloc-symbolize names
# release_buffer and make_buffer with the source lines of the free and the
# malloc. usage: check.sh SYMBOLIZE SOURCE [VAR=VALUE...] -- CMD [ARGS...]
set -uo pipefail
symbolize=$1 src=$2
shift 2
envs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
env "${envs[@]}" "$@" 2>"$dir/report" >/dev/null
rc=$?
fail() { echo "FAIL: $*" >&2; echo "--- report:" >&2; cat "$dir/report" >&2; [ -f "$dir/sym" ] && { echo "--- symbolized:" >&2; cat "$dir/sym" >&2; }; exit 1; }
[ "$rc" -eq $((128 + 11)) ] || fail "expected SIGSEGV, got exit status $rc"
grep -Eq '^qmalloc: ERROR: use-after-free \(write\) at 0x[0-9a-f]+ \(offset 16 in freed large chunk of 1048576 bytes at 0x[0-9a-f]+\)$' "$dir/report" || fail "no report line"
for h in 'accessed by thread [0-9]+ here:' 'freed by thread [0-9]+, 0 large frees and [0-9]+ ms ago, here:' 'previously allocated by thread [0-9]+ here:'; do
  grep -Eq "^  $h\$" "$dir/report" || fail "no '$h'"
done
grep -Eq '^    #0 0x[0-9a-f]+ \(/.+\+0x[0-9a-f]+\)' "$dir/report" || fail "frames not as '#N 0xPC (module+0xOFF)'"
"$symbolize" "$dir/report" >"$dir/sym" || fail "symbolize failed"
base=$(basename "$src")
line() { grep -n "$1" "$src" | cut -d: -f1; }
# each stack's own section: from its heading to the next heading
section() { awk -v h="$1" '/^  [a-z]/ { on = index($0, h) == 3 } on' "$dir/sym"; }
section "freed by" | grep -Eq "in release_buffer .*$base:$(line FREE-LINE)( |\$)" ||
  fail "freeing stack does not name release_buffer at $base:$(line FREE-LINE)"
section "previously allocated by" | grep -Eq "in make_buffer .*$base:$(line ALLOC-LINE)( |\$)" ||
  fail "allocating stack does not name make_buffer at $base:$(line ALLOC-LINE)"
section "accessed by" | grep -Eq "in main .*$base:$(line ACCESS-LINE)( |\$)" ||
  fail "access stack does not name main at $base:$(line ACCESS-LINE)"
echo "ok: release_buffer, make_buffer and the access named with their lines"
