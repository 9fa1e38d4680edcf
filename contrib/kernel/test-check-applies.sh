#!/usr/bin/env bash
# test-check-applies.sh: self-test of check-applies.sh on fake kernel trees.
# Owns: building a minimal tree (Makefile + mm/mprotect.c) under a temp dir
# from a given mprotect.c, and checking every verdict check-applies.sh gives.
#
# Usage: test-check-applies.sh MPROTECT_C [X.Y ...]
#   MPROTECT_C  an unpatched mm/mprotect.c of a 5.10 or 5.15 tree, e.g. from
#               `git show v5.10:mm/mprotect.c` in a kernel clone
#   X.Y         kernel versions to pretend the fake tree is (default: 5.10 5.15)
#
# No kernel source ships with qmalloc: the test only runs on a file you give
# it.  It says which git blob that file is, so you can tell which tree it came
# from.  Mainline and stable blobs the patches were checked against:
#   v5.10          56c02beb6041      5.10.y (2021-2025)  7ea0aee0c08d
#   5.15.y         ed18dc49533f
# Ends with "N passed, N failed"; exit status 0 only when all passed.

set -u

here=$(cd "$(dirname "$0")" && pwd)
check="$here/check-applies.sh"

if [ $# -lt 1 ] || [ ! -f "$1" ]; then
	echo "usage: test-check-applies.sh MPROTECT_C [X.Y ...]" >&2
	echo "  MPROTECT_C: an unpatched mm/mprotect.c from a 5.10 or 5.15 tree" >&2
	exit 2
fi
src=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(5.10 5.15)

work=$(mktemp -d "${TMPDIR:-/tmp}/qm-check-applies.XXXXXX")
trap 'rm -rf "$work"' EXIT

pass=0
fail=0

if command -v git >/dev/null 2>&1; then
	echo "input: $src (git blob $(git hash-object "$src" | cut -c1-12))"
else
	echo "input: $src"
fi

# fake_tree DIR X.Y FILE: a tree with just Makefile and mm/mprotect.c
fake_tree() {
	local dir=$1 v=${2%%.*} p=${2#*.}
	mkdir -p "$dir/mm"
	cp "$3" "$dir/mm/mprotect.c"
	printf 'VERSION = %s\nPATCHLEVEL = %s\nSUBLEVEL = 0\nEXTRAVERSION =\nNAME = fake\n' \
		"$v" "$p" > "$dir/Makefile"
}

# expect NAME WANTED_RC ARGS...: run check-applies.sh, compare exit status
expect() {
	local name=$1 want=$2 out rc
	shift 2
	out=$("$check" -q "$@" 2>&1)
	rc=$?
	out=${out%%$'\n'*}
	if [ "$rc" -eq "$want" ]; then
		pass=$((pass + 1))
		echo "ok   $name: $out"
	else
		fail=$((fail + 1))
		echo "FAIL $name: exit $rc, wanted $want: $out"
	fi
}

have_git=0
command -v git >/dev/null 2>&1 && have_git=1

for v in "${versions[@]}"; do
	case $v in
	[0-9]*.[0-9]*) ;;
	*) echo "skipping bad version '$v' (want X.Y)"; fail=$((fail + 1)); continue ;;
	esac

	# 1. a plain directory: patch(1), or git outside any repository
	t="$work/plain-$v"
	fake_tree "$t" "$v" "$src"
	expect "$v plain tree" 0 "$t"

	# 2. a git checkout, then the same checkout with the patch applied
	if [ $have_git -eq 1 ]; then
		t="$work/git-$v"
		fake_tree "$t" "$v" "$src"
		git -C "$t" init -q
		git -C "$t" add -A
		git -C "$t" -c user.name=test -c user.email=test@localhost \
			commit -q -m base
		expect "$v git checkout" 0 "$t"
		p=$(printf '%s\n' "$here"/0001-*-"$v".patch | head -n 1)
		if [ -r "$p" ] && git -C "$t" apply "$p" 2>/dev/null; then
			expect "$v already patched" 3 "$t"
		else
			fail=$((fail + 1))
			echo "FAIL $v already patched: could not apply $(basename "$p") to set up the case"
		fi
	fi

	# 3. a tree whose change_pte_range() lacks the dirty_accountable case
	t="$work/broken-$v"
	fake_tree "$t" "$v" "$src"
	sed '/Avoid taking write faults for known dirty pages/,/ptep_modify_prot_commit/{/ptep_modify_prot_commit/!d;}' \
		"$src" > "$t/mm/mprotect.c"
	if cmp -s "$src" "$t/mm/mprotect.c"; then
		fail=$((fail + 1))
		echo "FAIL $v broken tree: input has no dirty_accountable case to remove"
	else
		expect "$v broken tree" 1 "$t"
	fi
done

# 4. versions with nothing to do, and bad arguments
t="$work/v6"
fake_tree "$t" 6.1 "$src"
expect "6.1 not needed" 3 "$t"
expect "no argument" 2
expect "not a directory" 2 "$work/does-not-exist"
mkdir -p "$work/empty"
expect "not a kernel tree" 2 "$work/empty"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
