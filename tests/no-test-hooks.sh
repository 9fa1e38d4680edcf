#!/bin/sh
# no-test-hooks.sh SRCDIR PREFIX_LIB LIB...: every function src/ defines
# inside an #ifdef QM_TEST_HOOKS block is a test hook (see src/meson.build).
# Fails if nm lists one of them as defined in any LIB (the installed .so and
# .a), or if one is missing from PREFIX_LIB (then the names found here are
# not the ones built, and the check would prove nothing).
set -eu
src=$1 prefix=$2
shift 2
# names defined at the start of a line inside the blocks: "type qm__name("
hooks=$(awk '/^#ifdef QM_TEST_HOOKS/ {on = 1; next}
             on && /^#endif/ {on = 0; next}
             on && /^[a-z].* \**qm__[a-z0-9_]+\(.*\{/ {
               match($0, /qm__[a-z0-9_]+\(/); print substr($0, RSTART, RLENGTH - 1) }' \
  $(find "$src" -name '*.c' | sort) | sort -u)
[ -n "$hooks" ] || { echo "no test hooks found in the .c files of $src"; exit 1; }
# these are hooks whatever the parse finds: it must at least see them
for must in qm__ro_unseal qm__central_group_free qm__meta_ranges qm__large_flush; do
  echo "$hooks" | grep -qx "$must" || { echo "$must is not inside #ifdef QM_TEST_HOOKS"; exit 1; }
done
fail=0
defined() { nm --defined-only "$1" 2>/dev/null | awk '{print $NF}' | sort -u; }
have=$(defined "$prefix")
for h in $hooks; do
  echo "$have" | grep -qx "$h" || { echo "$h: not in $prefix"; fail=1; }
done
for lib in "$@"; do
  have=$(defined "$lib")
  for h in $hooks; do
    if echo "$have" | grep -qx "$h"; then
      echo "$h: test hook in $lib"
      fail=1
    fi
  done
done
[ $fail = 0 ] && echo "$(echo "$hooks" | wc -l) test hooks, none in $*"
exit $fail
