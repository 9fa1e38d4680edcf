#!/bin/sh
# man-lists-options.sh MAN OPTIONS_DEF: the generated qmalloc(3) has an
# entry (".TP" then "\fBname\fP=") for every option of options.def, and no
# other; and man renders it without warnings where man is installed.
set -eu
man=$1 def=$2
names=$(sed -n 's/^QM_OPT(\([a-z_0-9]*\),.*/\1/p' "$def" | sort)
listed=$(sed -n 's/^\\fB\([a-z_0-9]*\)\\fP=.*/\1/p' "$man" | sort)
[ "$(echo "$names" | wc -l)" -gt 20 ] || { echo "read no options from $def"; exit 1; }
if [ "$names" != "$listed" ]; then
  echo "options.def and $man differ:"
  echo "$names" > "$man.want"
  echo "$listed" | diff "$man.want" - || true
  exit 1
fi
if command -v man >/dev/null 2>&1; then
  out=$(MANWIDTH=80 man --warnings -l "$man" 2>&1 >/dev/null) || { echo "$out"; exit 1; }
  [ -z "$out" ] || { echo "man warns: $out"; exit 1; }
fi
echo "ok: $(echo "$names" | wc -l) options in $man"
