#!/usr/bin/env bash
# test-check-applies.sh: self-test of check-applies.sh on fake kernel trees.
# Owns: building minimal trees (Makefile + the files a series touches) under
# a temp dir from a real unpatched tree, and checking every verdict and exit
# status check-applies.sh gives.
#
# Usage: test-check-applies.sh TREE [X.Y ...]
#   TREE  an unpatched 5.10 or 5.15 kernel source tree (or one holding at
#         least the files the series touch, at their paths)
#   X.Y   series to test against it (default: the tree's own X.Y)
#
# No kernel source ships with qmalloc: the test only runs on a tree you give
# it.  It prints the git blob of TREE's mm/mprotect.c and mm/memory.c, so you
# can tell which stable release they came from (see README.md).
# Ends with "N passed, N failed"; exit status 0 only when all passed.

set -u

here=$(cd "$(dirname "$0")" && pwd)
check="$here/check-applies.sh"

if [ $# -lt 1 ] || [ ! -f "$1/Makefile" ] || [ ! -f "$1/mm/mprotect.c" ]; then
	echo "usage: test-check-applies.sh TREE [X.Y ...]" >&2
	echo "  TREE: an unpatched 5.10 or 5.15 kernel source tree" >&2
	exit 2
fi
src=$(cd "$1" && pwd)
shift
mkvar() { sed -n "s/^$1[[:space:]]*=[[:space:]]*\\([0-9]*\\).*/\\1/p" "$src/Makefile" | head -n 1; }
own="$(mkvar VERSION).$(mkvar PATCHLEVEL)"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=("$own")

work=$(mktemp -d "${TMPDIR:-/tmp}/qm-check-applies.XXXXXX")
trap 'rm -rf "$work"' EXIT

pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

echo "input: $src (Linux $own.$(mkvar SUBLEVEL))"
if command -v git >/dev/null 2>&1; then
	for f in mm/mprotect.c mm/memory.c; do
		echo "  $f: git blob $(git hash-object "$src/$f" | cut -c1-12)"
	done
fi

# files_of X.Y: the files the X.Y series changes (not the ones it creates)
files_of() {
	cat "$here/$1"/0[0-9][0-9][1-9]-*.patch | awk '
		/^diff --git / { f = substr($3, 3); next }
		/^new file mode/ { f = "" }
		/^index / && f != "" { print f; f = "" }' | sort -u
}

# fake_tree DIR X.Y: a tree with Makefile (version X.Y) and the series' files
fake_tree() {
	local dir=$1 v=${2%%.*} p=${2#*.} f
	mkdir -p "$dir"
	while read -r f; do
		mkdir -p "$dir/$(dirname "$f")"
		cp "$src/$f" "$dir/$f" 2>/dev/null || return 1
	done < <(files_of "$series")
	printf 'VERSION = %s\nPATCHLEVEL = %s\nSUBLEVEL = 0\nEXTRAVERSION =\nNAME = fake\n' \
		"$v" "$p" >"$dir/Makefile"
}

# expect NAME WANTED_RC ARGS...: run check-applies.sh, compare exit status
expect() {
	local name=$1 want=$2 out rc
	shift 2
	out=$("$check" -q "$@" 2>&1)
	rc=$?
	out=${out%%$'\n'*}
	if [ "$rc" -eq "$want" ]; then
		ok "$name: $out"
	else
		bad "$name: exit $rc, wanted $want: $out"
	fi
}

have_git=0
command -v git >/dev/null 2>&1 && have_git=1

for v in "${versions[@]}"; do
	series=$v
	if [ ! -d "$here/$v" ]; then
		bad "$v: no series directory $here/$v"
		continue
	fi
	# the check of one patch at a time is only right if no two touch a file
	dup=$(for p in "$here/$v"/0[0-9][0-9][1-9]-*.patch; do
		grep '^diff --git ' "$p" | awk '{print $3}' | sort -u
	done | sort | uniq -d)
	if [ -z "$dup" ]; then ok "$v: the patches touch disjoint files"; else bad "$v: files in two patches: $dup"; fi

	# 1. a plain directory: patch(1), or git outside any repository
	t="$work/plain-$v"
	if ! fake_tree "$t" "$v"; then
		bad "$v: $src lacks a file the series changes"
		continue
	fi
	expect "$v plain tree" 0 "$t"

	# 2. a git checkout, then the same checkout partly and fully patched
	if [ $have_git -eq 1 ]; then
		t="$work/git-$v"
		fake_tree "$t" "$v"
		git -C "$t" init -q
		git -C "$t" add -A
		git -C "$t" -c user.name=test -c user.email=test@localhost commit -q -m base
		expect "$v git checkout" 0 "$t"
		first=$(printf '%s\n' "$here/$v"/0001-*.patch | head -n 1)
		if git -C "$t" apply "$first" 2>/dev/null; then
			expect "$v first patch only" 1 "$t"
		else
			bad "$v first patch only: could not apply $(basename "$first") to set up the case"
		fi
		rest_ok=1
		for p in "$here/$v"/0[0-9][0-9][2-9]-*.patch; do
			git -C "$t" apply "$p" 2>/dev/null || rest_ok=0
		done
		if [ $rest_ok -eq 1 ]; then
			expect "$v already patched" 3 "$t"
		else
			bad "$v already patched: could not apply the series to set up the case"
		fi
	fi

	# 3. a tree whose change_pte_range() lacks the dirty_accountable case
	t="$work/broken-$v"
	fake_tree "$t" "$v"
	sed '/Avoid taking write faults for known dirty pages/,/ptep_modify_prot_commit/{/ptep_modify_prot_commit/!d;}' \
		"$src/mm/mprotect.c" >"$t/mm/mprotect.c"
	if cmp -s "$src/mm/mprotect.c" "$t/mm/mprotect.c"; then
		bad "$v broken tree: input has no dirty_accountable case to remove"
	else
		expect "$v broken tree" 1 "$t"
	fi

	# 4. the same files in a tree of a version no series was written for
	t="$work/other-$v"
	fake_tree "$t" 5.12
	expect "$v files as Linux 5.12: unsupported version" 4 "$t"
	expect "$v forced with -p" 0 -p "$here/$v" "$t"
done

# 5. versions with nothing to do, and bad arguments
t="$work/v6"
series=${versions[0]}
fake_tree "$t" 6.1
expect "6.1 not needed" 3 "$t"
expect "no argument" 2
expect "not a directory" 2 "$work/does-not-exist"
mkdir -p "$work/empty"
expect "not a kernel tree" 2 "$work/empty"
expect "-p with no such series" 2 -p "$work/no-such-series" "$t"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
