#!/usr/bin/env bash
# addrspace.sh: the address space a program holds under qmalloc, against the
# same program under glibc. Usage:
#   addrspace.sh vmsize PLAIN QM [LIB]   PLAIN: the program built alone; QM:
#     the same built with qmalloc linked in (LIB empty), or PLAIN again with
#     LIB preloaded. After one malloc of each kind, VmSize under qmalloc is
#     at most glibc's + 64 MiB.
#   addrspace.sh rlimit QM [LIB]: RLIMIT_AS lowered to 200 MiB after start.
# QMALLOC_OPTIONS from the environment (the profile); sampling at 1 in 64 is
# added so that the program's 256 small mallocs take some guarded slots.
set -u
# Under qemu-user VmSize and RLIMIT_AS are the emulator's process's: its
# own mappings, and the guest's space it reserves; it ignores a guest's
# setrlimit(RLIMIT_AS)
# shellcheck source=../preload/preloaded.sh
. "$(dirname "$0")/../preload/preloaded.sh"
skip_emulated "VmSize and RLIMIT_AS are the emulator's, not the program's"
mode=$1
shift
run() { # PROGRAM LIB ARGS...
  local p=$1 l=$2
  shift 2
  if [ -n "$l" ]; then LD_PRELOAD=$l "$p" "$@"; else "$p" "$@"; fi
}
case $mode in
vmsize)
  plain=$1 qm=$2 lib=${3:-}
  base=$(env -u QMALLOC_OPTIONS "$plain" vmsize) || { echo "plain run failed"; exit 1; }
  opts=${QMALLOC_OPTIONS:+$QMALLOC_OPTIONS:}sample_rate=64
  got=$(QMALLOC_OPTIONS=$opts run "$qm" "$lib" vmsize) || { echo "run under qmalloc failed"; exit 1; }
  echo "VmSize: glibc $base KiB, qmalloc $got KiB (QMALLOC_OPTIONS=$opts)"
  if [ "$got" -gt $((base + 65536)) ]; then
    echo "more than 64 MiB over glibc's"
    exit 1
  fi
  ;;
rlimit)
  qm=$1 lib=${2:-}
  run "$qm" "$lib" rlimit
  ;;
*)
  echo "usage: $0 vmsize|rlimit ..." >&2
  exit 2
  ;;
esac
