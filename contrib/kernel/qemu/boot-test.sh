#!/usr/bin/env bash
# boot-test.sh: runs qmalloc's tests on a kernel image you have built, by
# booting it under QEMU (software emulation) with an initramfs of the tests.
# Owns: qmalloc's own builds for the guest (static unit tests, probe and
# reuse check; shared and sanitizer builds for the suites that need them),
# the initramfs, the boot with a time limit, and the report. It builds no
# kernel: the image is an argument. Not part of ./qmalloc test.
#
# Usage: boot-test.sh [options] BZIMAGE   (see usage below)
# Exit status: 0 every test passed or skipped, 1 a test failed or the guest
# did not finish, 2 usage or a missing host tool.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
me=boot-test

usage() {
  cat >&2 <<'EOF'
usage: boot-test.sh [options] BZIMAGE
  -w DIR     work directory: qmalloc builds, initramfs, logs (default: build-qemu/ in the checkout)
  -n NAME    name of this run's log and report (default: the image's kernel version)
  -t SECS    time limit of the whole boot (default: 7200)
  -f FACTOR  time limit of each test: meson's timeout times FACTOR (default: 10)
  -m MB      guest memory (default: 2048)
  -c CPUS    guest CPUs (default: 2)
  -p N       runs of qmalloc-probe --json (default: 5)
  -s SUITES  comma-separated meson suites or test names to run, and -PREFIX to leave
             out the tests whose name starts with PREFIX (default: unit,kernel,tools,
             examples,linked,preload,hardening, and san-* for the sanitizer build)
  -S         no sanitizer build (faster)
  -x 'PROG [ARGS]'
             also run PROG, a static executable (e.g. a kernel selftest), in the guest;
             exit 0 passes, 4 (kselftest) or 77 (meson) skips; repeatable
  -a ARGS    more kernel command-line arguments (e.g. transparent_hugepage=never)
Host packages (Debian): qemu-system-x86 busybox-static cpio meson ninja-build g++ libgtest-dev python3
EOF
  exit 2
}

say() { printf '%s: %s\n' "$me" "$*" >&2; }
die() {
  say "$*"
  exit 2
}

work=$root/build-qemu
name=
limit=7200
factor=10
mem=2048
cpus=2
probe_runs=5
suites=
san=1
extra=()
append=
while getopts ':w:n:t:f:m:c:p:s:Sx:a:h' opt; do
  case $opt in
  w) work=$OPTARG ;;
  n) name=$OPTARG ;;
  t) limit=$OPTARG ;;
  f) factor=$OPTARG ;;
  m) mem=$OPTARG ;;
  c) cpus=$OPTARG ;;
  p) probe_runs=$OPTARG ;;
  s) suites=$OPTARG ;;
  S) san=0 ;;
  x) extra+=("$OPTARG") ;;
  a) append=$OPTARG ;;
  *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || usage
image=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
[ -f "$image" ] || die "no kernel image at $1"

# Host tools, with the Debian package of each.
missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need qemu-system-x86_64 qemu-system-x86
need cpio cpio
need meson meson
need ninja ninja-build
need g++ g++
need python3 python3
need readelf binutils
busybox=
for b in /bin/busybox /usr/bin/busybox; do
  if [ -x "$b" ] && ! readelf -l "$b" 2>/dev/null | grep -q INTERP; then busybox=$b; fi
done
[ -n "$busybox" ] || missing+=(busybox-static)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
for e in ${extra[@]+"${extra[@]}"}; do
  read -r p _ <<<"$e"
  [ -x "$p" ] || die "-x $p: not an executable"
  readelf -l "$p" 2>/dev/null | grep -q INTERP && die "-x $p: not statically linked"
done
[ ${#missing[@]} -eq 0 ] || die "missing host packages; install them with: apt-get install ${missing[*]}"

# The image's version, from the bzImage header ("5.10.265 (user@host) #1 ...").
kver=$(file -b "$image" 2>/dev/null | sed -n 's/.*version \([^ ,]*\).*/\1/p')
[ -n "$name" ] || name=${kver:-$(basename "$image")}
mkdir -p "$work"
work=$(cd "$work" && pwd)

# qmalloc, three ways: static (no loader in the guest needed), shared (the
# linked and preload suites need libqmalloc.so), and under ASan/UBSan as
# ./qmalloc test also runs the unit tests. Each is configured once.
setup() { # DIR MESON_ARGS...
  local dir=$1 src=
  shift
  # a work directory reused from another checkout would build that one
  if [ -f "$dir/meson-info/meson-info.json" ]; then
    src=$(sed -n 's/.*"source": *"\([^"]*\)".*/\1/p' "$dir/meson-info/meson-info.json")
    if [ "$src" != "$root" ]; then
      say "$dir was configured for $src, not $root: configuring it again"
      rm -rf "$dir"
    fi
  fi
  if [ ! -f "$dir/build.ninja" ]; then
    say "configuring $dir"
    meson setup "$dir" "$root" -Dbench=false "$@" >/dev/null
  fi
}
setup "$work/static" -Dprefer_static=true -Dc_link_args=-static -Dcpp_link_args=-static
setup "$work/shared"
say "building qmalloc for the guest"
# only the programs that can be linked statically: not libqmalloc.so
nice -n 10 meson compile -C "$work/static" unit-tests qmalloc-probe mprotect-reuse-check \
  linked_static >/dev/null || meson compile -C "$work/static" unit-tests
nice -n 10 meson compile -C "$work/shared" >/dev/null || meson compile -C "$work/shared"
san_dir=
if [ "$san" -eq 1 ]; then
  setup "$work/san" -Db_sanitize=address,undefined -Db_lundef=false
  nice -n 10 meson compile -C "$work/san" >/dev/null || meson compile -C "$work/san"
  san_dir=$work/san
fi

# The plan: which tests, and the host files they need in the guest.
run=$work/run-$name
rm -rf "$run"
mkdir -p "$run"
python3 "$here/suite.py" plan --out "$run" --factor "$factor" --static "$work/static" \
  --shared "$work/shared" --san "$san_dir" --suites "$suites" --probe-runs "$probe_runs" \
  ${extra[@]+"${extra[@]}"}

# The initramfs: busybox, /init, and every file at its host path (so each test's
# command line runs unchanged). Debug info is stripped from the copies.
rootfs=$run/rootfs
mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,qm}
cp "$busybox" "$rootfs/bin/busybox"
for a in $("$busybox" --list); do
  case $a in busybox) continue ;; esac
  [ -e "$rootfs/bin/$a" ] || ln -s busybox "$rootfs/bin/$a"
done
ln -s ../../bin/env "$rootfs/usr/bin/env"
while read -r f; do
  [ -n "$f" ] || continue
  mkdir -p "$rootfs$(dirname "$f")"
  if [ -L "$f" ]; then
    ln -sf "$(readlink -f "$f")" "$rootfs$f"
  else
    cp -p "$f" "$rootfs$f"
    if head -c 4 "$f" | grep -q ELF; then strip --strip-debug "$rootfs$f" 2>/dev/null || true; fi
  fi
done <"$run/files.txt"
while read -r d; do [ -z "$d" ] || mkdir -p "$rootfs$d"; done <"$run/dirs.txt"
cp "$run/run.sh" "$rootfs/qm/run.sh"
cat >"$rootfs/init" <<'EOF'
#!/bin/sh
# the guest's init: mount what the tests read, run them, print markers, stop
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs tmp /tmp
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/tmp TMPDIR=/tmp
echo "@@QM KERNEL $(uname -r)"
echo "@@QM CMDLINE $(cat /proc/cmdline)"
echo "@@QM CPUS $(nproc)"
echo "@@QM THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
# the clock the tests time with (jiffies: whole ticks, no high-resolution timers)
echo "@@QM CLOCK $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
. /qm/run.sh
echo "@@QM DONE"
sync
reboot -f
EOF
chmod +x "$rootfs/init"
initrd=$run/initramfs.cpio
(cd "$rootfs" && find . | cpio -o -H newc --quiet) >"$initrd"
say "initramfs: $(du -h "$initrd" | cut -f1), $(grep -c '^t ' "$run/run.sh") tests"

# The boot: TCG (no KVM needed), serial console on stdout, no reboot (the
# guest's reboot ends QEMU), and a time limit on the whole.
# random.trust_cpu=on: the CPU's RDRAND seeds the kernel's random pool at
# boot, as entropy does on a machine that has run for a while; without it a
# 5.10 guest's getrandom(GRND_NONBLOCK) fails with EAGAIN for a long while.
cmdline="console=ttyS0 quiet loglevel=4 panic=-1 random.trust_cpu=on${append:+ $append}"
qemu=(qemu-system-x86_64 -accel tcg -cpu max -smp "$cpus" -m "$mem" -kernel "$image"
  -initrd "$initrd" -append "$cmdline" -display none -monitor none -serial stdio -no-reboot)
log=$work/$name.log
printf '%q ' "${qemu[@]}" >"$work/$name.cmd"
echo >>"$work/$name.cmd"
say "booting $image (limit ${limit}s); console in $log"
say "$(cat "$work/$name.cmd")"
start=$(date +%s)
rc=0
timeout -k 10 "$limit" "${qemu[@]}" </dev/null >"$log" 2>&1 || rc=$?
say "guest ran $(($(date +%s) - start))s (qemu exit $rc)"

report=$work/$name.report
set +e
python3 "$here/suite.py" report "$run/plan.json" "$log" | tee "$report"
status=${PIPESTATUS[0]}
echo "boot command: $(cat "$work/$name.cmd")" | tee -a "$report"
exit "$status"
