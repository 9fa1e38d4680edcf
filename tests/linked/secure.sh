#!/usr/bin/env bash
# secure.sh PROG PROFILE: runs PROG (secure.c, linked with libqmalloc.a) as a
# set-user-ID copy: owned by nobody, mode 4755, run by root, so that the
# kernel sets AT_SECURE (effective user nobody, real user root). There
# QMALLOC_OPTIONS, which would turn the quarantine off and write a log file,
# must be ignored with one warning, and the program's own options kept. The
# same copy without the set-user-ID bit must obey the variable (else this
# test could not fail). Skips (77) where it cannot make the copy.
set -uo pipefail
prog=$1 profile=$2
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# under qemu-user the emulator is what is exec'd: its set-user-ID bit, not
# the program's, would set AT_SECURE, and qemu hands the guest its own
# shellcheck source=../preload/preloaded.sh
. "$(dirname "$0")/../preload/preloaded.sh"
skip_emulated "AT_SECURE is the emulator's, not the program's"
[ "$(id -u)" -eq 0 ] || skip "needs root to make a set-user-ID copy owned by nobody"
id nobody >/dev/null 2>&1 || skip "no user nobody"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
chmod 0777 "$dir"
cp "$prog" "$dir/secure" && chown nobody "$dir/secure" || skip "cannot copy and chown into $dir"
opts="strategy=none:verbose=0:log_path=$dir/log:stack_frames=0:hardening=default:hardening=max"
[ "$profile" = max ] && opts=${opts%:hardening=max}

chmod 0755 "$dir/secure"
out=$(QMALLOC_OPTIONS=$opts "$dir/secure" 2>"$dir/err") || fail "plain copy failed: $(cat "$dir/err")"
[ "$out" = "secure=0 strategy=none" ] || fail "plain copy: expected the variable obeyed, got '$out'"
[ ! -s "$dir/err" ] || fail "plain copy printed: $(cat "$dir/err")"
rm -f "$dir"/log.*

chmod 4755 "$dir/secure"
out=$(QMALLOC_OPTIONS=$opts "$dir/secure" 2>"$dir/err") || fail "set-user-ID copy failed: $(cat "$dir/err")"
case $out in
  secure=0*) skip "the kernel did not set AT_SECURE for a set-user-ID copy in $dir (nosuid mount?)" ;;
  "secure=1 strategy="*) ;;
  *) fail "unexpected output '$out'" ;;
esac
[ "$out" != "secure=1 strategy=none" ] || fail "QMALLOC_OPTIONS turned the quarantine off"
head -1 "$dir/err" | grep -qx "qmalloc: WARNING: QMALLOC_OPTIONS ignored: secure execution (set-user-ID, set-group-ID or file capabilities)" ||
  fail "no warning first: $(cat "$dir/err")"
grep -q "^qmalloc: option verbose=1 " "$dir/err" || fail "the program's own verbose=1 lost: $(cat "$dir/err")"
grep -q "^qmalloc: option stack_frames=5 " "$dir/err" || fail "the program's stack_frames=5 lost: $(cat "$dir/err")"
grep -q "^qmalloc: option hardening=$profile " "$dir/err" || fail "hardening not $profile: $(cat "$dir/err")"
grep -q "^qmalloc: option strategy=auto " "$dir/err" || fail "strategy not auto: $(cat "$dir/err")"
grep -q "^qmalloc: option log_path= " "$dir/err" || fail "log_path taken: $(cat "$dir/err")"
ls "$dir"/log.* >/dev/null 2>&1 && fail "a log file was written: $(ls "$dir")"
echo "ok: the set-user-ID copy ignored QMALLOC_OPTIONS ($out)"
