# preloaded.sh, sourced by the tests' scripts: how to run a target program
# with the library preloaded, natively or under qemu-user (QMT_EMULATED, set
# by tests/meson.build for a cross build), where the program runs through
# the cross file's wrapper (MESON_EXE_WRAPPER) and LD_PRELOAD must reach the
# guest alone (-E): set for qemu itself it would name a library of the
# wrong architecture.

# preload_prefix LIB: sets the array PRE to the words that, put before a
# command, run it with LIB preloaded ("${PRE[@]}" CMD ARGS...)
preload_prefix() {
  if [ -n "${QMT_EMULATED:-}" ]; then
    read -r -a PRE <<<"${MESON_EXE_WRAPPER:?QMT_EMULATED without MESON_EXE_WRAPPER}"
    PRE+=(-E "LD_PRELOAD=$1")
  else
    PRE=(env "LD_PRELOAD=$1")
  fi
}

# drop_emulator_lines FILE: qemu-user's own line on a death by signal
# ("qemu: uncaught target signal 6 (Aborted) - core dumped") is no line of
# the program's
drop_emulator_lines() {
  [ -z "${QMT_EMULATED:-}" ] || sed -i '/^qemu: uncaught target signal /d' "$1"
}

# skip_emulated REASON: under qemu-user, says why the test means nothing
# there and exits 77 (meson's skip)
skip_emulated() {
  [ -z "${QMT_EMULATED:-}" ] || { echo "SKIP under qemu-user: $*"; exit 77; }
}
