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
# the report's lines as the one definition of the format has them
# shellcheck source=../report.re
. "$(dirname "$0")/../report.re"
first=${QM_LINE_AT//@KIND@/$QM_K_UAF}
first=${first//@RW@/write}
first=${first//@D@/offset 16 in freed large chunk of 1048576 bytes at $QM_HEX}
grep -Eqx -- "$first" "$dir/report" || fail "no report line /$first/"
for h in "$QM_ACCESS_HEAD" "$QM_FREED_HEAD" "$QM_PREV_ALLOC_HEAD"; do
  grep -Eqx -- "$h" "$dir/report" || fail "no '$h'"
done
grep -Eqx -- "$QM_FRAME" "$dir/report" || fail "frames not as /$QM_FRAME/"
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
