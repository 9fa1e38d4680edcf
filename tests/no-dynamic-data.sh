#!/bin/sh
# no-dynamic-data.sh LIB: the shared library exports functions only. A data
# symbol visible in its dynamic table (such as the linker's __start_qm_ro,
# the start of the sealed state) would let any code in the process find the
# sealed keys with dlsym. A hidden entry (ld keeps __start_qm_ro there,
# hidden) is never found by the dynamic linker.
set -eu
lib=$1
syms=$(readelf --dyn-syms -W "$lib" | awk 'NR > 3 && $7 != "UND"')
fns=$(echo "$syms" | awk '$4 == "FUNC" || $4 == "IFUNC"' | wc -l)
[ "$fns" -gt 0 ] || { echo "no functions exported by $lib: readelf found nothing"; exit 1; }
# section symbols (arm64's linker puts .init's and .data's in the table)
# name no object
data=$(echo "$syms" | awk '$4 != "FUNC" && $4 != "IFUNC" && $4 != "SECTION" && $6 != "HIDDEN" && $6 != "INTERNAL" {print $8}')
if [ -n "$data" ]; then
  echo "data exported by $lib:"
  echo "$data"
  exit 1
fi
echo "$fns functions and no visible data exported by $lib"
