#!/usr/bin/env bash
# check-applies.sh: tells whether qmalloc's companion mprotect patch applies
# to a kernel source tree, without changing the tree.
# Owns: the choice of patch by kernel version and the one-line verdict.
#
# Usage: check-applies.sh [-q] [-p PATCH] TREE
#   TREE      top of a Linux source tree (the directory holding Makefile and mm/)
#   -p PATCH  check this patch file instead of choosing one by version
#   -q        print only the verdict line
#
# The kernel version comes from VERSION/PATCHLEVEL/SUBLEVEL in TREE/Makefile.
# 5.10 and 5.15 use their own patch; 6.0 and later need none (the fast path is
# upstream); any other version gets every patch tried in turn, and a verdict
# that says no patch was written for it.  A git checkout is checked with
# `git apply --check`; any other directory with `patch -p1 --dry-run --fuzz=0`
# (or `git apply --check` outside any repository when patch(1) is missing).
#
# Exit status: 0 the patch applies; 1 it does not; 2 bad arguments or not a
# kernel tree; 3 nothing to do (already applied, or 6.0+ has the fast path).

set -u

prog=check-applies
here=$(cd "$(dirname "$0")" && pwd)
quiet=0
forced_patch=

usage() {
	cat >&2 <<'EOF'
usage: check-applies.sh [-q] [-p PATCH] TREE
  TREE      top of a Linux source tree (holds Makefile and mm/mprotect.c)
  -p PATCH  check PATCH instead of the patch chosen by the tree's version
  -q        print only the one-line verdict
exit: 0 applies, 1 does not apply, 2 usage or not a kernel tree,
      3 nothing to do (already applied, or Linux 6.0+)
EOF
	exit 2
}

say() { [ "$quiet" -eq 1 ] || printf '%s\n' "$*" >&2; }
verdict() { printf '%s: %s\n' "$prog" "$*"; }

while getopts ':qp:h' opt; do
	case $opt in
	q) quiet=1 ;;
	p) forced_patch=$OPTARG ;;
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

tool_name() {
	case $method in
	git) echo "git apply --check" ;;
	git-noindex) echo "git apply --check (outside any repository)" ;;
	patch) echo "patch -p1 --dry-run --fuzz=0" ;;
	esac
}

# Try one patch; print the verdict and exit.
try_patch() {
	local p=$1 name why
	name=$(basename "$p")
	if [ ! -r "$p" ]; then
		verdict "ERROR: cannot read patch $p"
		exit 2
	fi
	say "Linux $kver in $tree; checking $name with $(tool_name)"
	if check_one "$p"; then
		verdict "APPLIES: $name applies cleanly to Linux $kver ($(tool_name))"
		exit 0
	fi
	why=$check_out
	if check_one "$p" -R; then
		verdict "ALREADY APPLIED: $name is already in Linux $kver ($tree)"
		exit 3
	fi
	say "$(printf '%s\n' "$why" | sed 's/^/  /')"
	verdict "DOES NOT APPLY: $name does not apply to Linux $kver ($(tool_name) failed)"
	exit 1
}

if [ -n "$forced_patch" ]; then
	case $forced_patch in /*) ;; *) forced_patch=$(pwd)/$forced_patch ;; esac
	try_patch "$forced_patch"
fi

if [ "$ver" -ge 6 ]; then
	verdict "NOT NEEDED: Linux $kver has the mprotect fast path upstream (since 6.0; clean pages and THP since 6.2)"
	exit 3
fi

for p in "$here"/0001-*-"$ver.$lvl".patch; do
	[ -r "$p" ] && try_patch "$p"
done

# No patch written for this version: try each, and say so.
found=
for p in "$here"/0001-*.patch; do
	[ -r "$p" ] || continue
	found=1
	say "no patch for Linux $ver.$lvl; trying $(basename "$p") with $(tool_name)"
	if check_one "$p"; then
		verdict "APPLIES (UNSUPPORTED VERSION): $(basename "$p") applies to Linux $kver, but was written for another tree: review it against this tree's do_wp_page() before use"
		exit 0
	fi
done
if [ -z "$found" ]; then
	verdict "ERROR: no patch files next to $0"
	exit 2
fi
verdict "DOES NOT APPLY: no patch here fits Linux $kver (patches exist for 5.10 and 5.15 only)"
exit 1
