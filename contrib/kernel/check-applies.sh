#!/usr/bin/env bash
# check-applies.sh: tells whether qmalloc's companion mprotect patch series
# applies to a kernel source tree, without changing the tree.
# Owns: the choice of series by kernel version and the one-line verdict.
#
# Usage: check-applies.sh [-q] [-p SERIES] TREE
#   TREE       top of a Linux source tree (the directory holding Makefile and mm/)
#   -p SERIES  check this series (a directory of NNNN-*.patch, or one patch file)
#              instead of choosing one by version
#   -q         print only the verdict line
#
# The kernel version comes from VERSION/PATCHLEVEL/SUBLEVEL in TREE/Makefile.
# 5.10 and 5.15 use their own series (5.10/ and 5.15/ next to this script);
# 6.0 and later need none (the fast path is upstream); any other version gets
# every series tried in turn, and a verdict that says none was written for it.
# A git checkout is checked with `git apply --check`; any other directory with
# `patch -p1 --dry-run --fuzz=0` (or `git apply --check` outside any
# repository when patch(1) is missing).  The patches of a series touch
# disjoint sets of files, so each is checked against the tree as it is; the
# series applies when all of them do (the cover letter, 0000-*, is no patch).
#
# Exit status: 0 the series applies; 1 it does not; 2 bad arguments or not a
# kernel tree; 3 nothing to do (already applied, or 6.0+ has the fast path);
# 4 a series applies, but it was written for another version (review it
# against the tree before use).

set -u

prog=check-applies
here=$(cd "$(dirname "$0")" && pwd)
quiet=0
forced=

usage() {
	cat >&2 <<'EOF'
usage: check-applies.sh [-q] [-p SERIES] TREE
  TREE       top of a Linux source tree (holds Makefile and mm/mprotect.c)
  -p SERIES  check SERIES (a directory of patches, or one patch) instead of
             the series chosen by the tree's version
  -q         print only the one-line verdict
exit: 0 applies, 1 does not apply, 2 usage or not a kernel tree,
      3 nothing to do (already applied, or Linux 6.0+),
      4 applies, but the series was written for another version
EOF
	exit 2
}

say() { [ "$quiet" -eq 1 ] || printf '%s\n' "$*" >&2; }
verdict() { printf '%s: %s\n' "$prog" "$*"; }

while getopts ':qp:h' opt; do
	case $opt in
	q) quiet=1 ;;
	p) forced=$OPTARG ;;
	h) usage ;;
	:) printf '%s: option -%s needs an argument\n' "$prog" "$OPTARG" >&2; usage ;;
	*) printf '%s: unknown option -%s\n' "$prog" "$OPTARG" >&2; usage ;;
	esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || usage
tree=$1

if [ ! -d "$tree" ]; then
	verdict "ERROR: $tree is not a directory"
	exit 2
fi
tree=$(cd "$tree" && pwd)
if [ ! -f "$tree/Makefile" ] || [ ! -f "$tree/mm/mprotect.c" ]; then
	verdict "ERROR: $tree is not a kernel tree (no Makefile or mm/mprotect.c)"
	exit 2
fi

mkvar() {
	sed -n "s/^$1[[:space:]]*=[[:space:]]*\\([0-9]*\\).*/\\1/p" "$tree/Makefile" | head -n 1
}
ver=$(mkvar VERSION)
lvl=$(mkvar PATCHLEVEL)
sub=$(mkvar SUBLEVEL)
if [ -z "$ver" ] || [ -z "$lvl" ]; then
	verdict "ERROR: no VERSION/PATCHLEVEL in $tree/Makefile"
	exit 2
fi
kver="$ver.$lvl${sub:+.$sub}"

# How to test a patch against this tree without touching it.
method=
top=$(git -C "$tree" rev-parse --show-toplevel 2>/dev/null || true)
if [ -n "$top" ] && [ "$(cd "$top" && pwd)" = "$tree" ]; then
	method="git"
elif command -v patch >/dev/null 2>&1; then
	method="patch"
elif command -v git >/dev/null 2>&1; then
	method="git-noindex"
else
	verdict "ERROR: need git or patch(1) to check $tree"
	exit 2
fi

# check_one PATCH [-R]: 0 when PATCH (or, with -R, its reverse) applies
# cleanly.  The tool's messages are left in $check_out.
check_out=
check_one() {
	local p=$1 rc
	shift
	case $method in
	git)
		check_out=$(git -C "$tree" apply --check "$@" "$p" 2>&1); rc=$? ;;
	git-noindex)
		# Stop git from finding an enclosing repository above TREE.
		check_out=$(cd "$tree" && GIT_CEILING_DIRECTORIES=$(dirname "$tree") \
			git apply --check "$@" "$p" 2>&1); rc=$? ;;
	patch)
		check_out=$(cd "$tree" && patch -p1 --dry-run --batch --forward \
			--fuzz=0 "$@" < "$p" 2>&1); rc=$? ;;
	esac
	return $rc
}

# patches_of SERIES: the patch files of a series directory, in order (or the
# one file given), one per line.
patches_of() {
	local s=$1 p
	if [ -d "$s" ]; then
		for p in "$s"/[0-9][0-9][0-9][0-9]-*.patch; do
			case $(basename "$p") in 0000-*) continue ;; esac
			[ -r "$p" ] && printf '%s\n' "$p"
		done
	elif [ -r "$s" ]; then
		printf '%s\n' "$s"
	fi
}

# check_series SERIES [-R]: 0 when every patch (or, with -R, every reverse)
# applies.  The first failure's messages are left in $check_out.
check_series() {
	local s=$1 p
	shift
	while read -r p; do
		check_one "$p" "$@" || return 1
	done < <(patches_of "$s")
	return 0
}

series_name() {
	local n
	n=$(patches_of "$1" | wc -l)
	printf '%s (%s patch%s)' "$(basename "$1")" "$n" "$([ "$n" -eq 1 ] || echo es)"
}

tool_name() {
	case $method in
	git) echo "git apply --check" ;;
	git-noindex) echo "git apply --check (outside any repository)" ;;
	patch) echo "patch -p1 --dry-run --fuzz=0" ;;
	esac
}

# Try one series; print the verdict and exit.
try_series() {
	local s=$1 name why
	if [ -z "$(patches_of "$s")" ]; then
		verdict "ERROR: no patches in $s"
		exit 2
	fi
	name=$(series_name "$s")
	say "Linux $kver in $tree; checking $name with $(tool_name)"
	if check_series "$s"; then
		verdict "APPLIES: $name applies cleanly to Linux $kver ($(tool_name))"
		exit 0
	fi
	why=$check_out
	if check_series "$s" -R; then
		verdict "ALREADY APPLIED: $name is already in Linux $kver ($tree)"
		exit 3
	fi
	say "$(printf '%s\n' "$why" | sed 's/^/  /')"
	verdict "DOES NOT APPLY: $name does not apply to Linux $kver ($(tool_name) failed)"
	exit 1
}

if [ -n "$forced" ]; then
	case $forced in /*) ;; *) forced=$(pwd)/$forced ;; esac
	[ -e "$forced" ] || { verdict "ERROR: no series or patch at $forced"; exit 2; }
	try_series "$forced"
fi

if [ "$ver" -ge 6 ]; then
	verdict "NOT NEEDED: Linux $kver has the mprotect fast path upstream (since 6.0; clean pages and THP since 6.2)"
	exit 3
fi

if [ -d "$here/$ver.$lvl" ]; then
	try_series "$here/$ver.$lvl"
fi

# No series written for this version: try each, and say so.
found=
for s in "$here"/[0-9]*.[0-9]*/; do
	s=${s%/}
	[ -n "$(patches_of "$s")" ] || continue
	found=1
	say "no series for Linux $ver.$lvl; trying $(series_name "$s") with $(tool_name)"
	if check_series "$s"; then
		verdict "APPLIES (UNSUPPORTED VERSION): $(series_name "$s") applies to Linux $kver, but was written for another tree: review it against this tree's do_wp_page() before use"
		exit 4
	fi
done
if [ -z "$found" ]; then
	verdict "ERROR: no patch series next to $0"
	exit 2
fi
verdict "DOES NOT APPLY: no series here fits Linux $kver (series exist for 5.10 and 5.15 only)"
exit 1
