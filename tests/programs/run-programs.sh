#!/usr/bin/env bash
# run-programs.sh: the programs suite. Runs a real program (python3, sqlite3, git, gcc, xz and
# zstd, sort) on generated inputs plain and with libqmalloc preloaded; passes only if the
# preloaded run succeeded, printed no qmalloc error or warning, and gave identical outputs.
set -euo pipefail

# Usage: run-programs.sh LIB PROGRAM; exits 0 (pass), 1 (fail, reason on stderr) or 77 (the
# program is not installed). QMALLOC_OPTIONS goes to the preloaded run only (e.g.
# strategy=discard); RUN_PROGRAMS_QUICK=1 drops the slowest pass (python3's PYTHONMALLOC=malloc)
# for runs under guard_all=1; RUN_PROGRAMS_KEEP=1 keeps the temporary directory for inspection.
me=run-programs
usage() {
  echo "usage: $me LIB PROGRAM   (PROGRAM: python3 sqlite3 git gcc compress sort)" >&2
  exit 1
}
[ $# -eq 2 ] || usage
lib=$1
prog=$2
case $prog in python3 | sqlite3 | git | gcc | compress | sort) ;; *) usage ;; esac

say() { printf '%s: %s\n' "$prog" "$*"; }
fail() {
  printf '%s: %s: FAIL: %s\n' "$me" "$prog" "$*" >&2
  exit 1
}
skip() {
  printf '%s: %s: SKIP: %s\n' "$me" "$prog" "$*" >&2
  exit 77
}

if [ ! -f "$lib" ] || [ ! -r "$lib" ]; then fail "no library at $lib"; fi
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")

# Commands each test needs; a missing one skips the test.
need=()
case $prog in
  python3) need=(python3) ;;
  sqlite3) need=(sqlite3) ;;
  git) need=(git) ;;
  gcc) need=(gcc) ;;
  compress) need=(xz zstd) ;;
  sort) need=(sort) ;;
esac
for c in "${need[@]}"; do
  command -v "$c" >/dev/null 2>&1 || skip "$c is not installed"
done
for c in awk sha256sum; do
  command -v "$c" >/dev/null 2>&1 || fail "$c is not installed (needed to generate inputs)"
done

# The interpreter itself, not a version manager's shim: both runs use the same binary.
if [ "$prog" = python3 ]; then
  py=$(python3 -c 'import sys; print(sys.executable)') || fail "python3 does not run"
  [ -x "$py" ] || fail "python3 reports no executable"
fi

user_opts=${QMALLOC_OPTIONS-}
# RUN_PROGRAMS_DIV=N divides each workload's volume by N (counts, rows, files, bytes; not
# the operations run): the strategy and guard_all runs use it, the default runs do not
div=${RUN_PROGRAMS_DIV:-1}
case $div in '' | *[!0-9]* | 0) fail "RUN_PROGRAMS_DIV must be a positive integer, not '$div'" ;; esac
export RUN_PROGRAMS_DIV=$div
# meson test sets MALLOC_PERTURB_, which makes glibc's malloc fill every block it hands
# out and takes back: the plain run of sort takes six times as long with it
unset QMALLOC_OPTIONS LD_PRELOAD MALLOC_PERTURB_ MALLOC_CHECK_
export LC_ALL=C TZ=UTC

tmp=$(mktemp -d "${TMPDIR:-/tmp}/qmalloc-programs.XXXXXX")
cleanup() {
  if [ "${RUN_PROGRAMS_KEEP:-0}" = 1 ]; then
    echo "$prog: kept $tmp"
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP
export HOME=$tmp/home XDG_CONFIG_HOME=$tmp/home/.config TMPDIR=$tmp/tmp
mkdir -p "$HOME" "$TMPDIR" "$tmp/gen"
gen=$tmp/gen   # generated inputs, shared by both runs
work=$tmp/work # the working directory of a run (same path in both runs)

# ---- running a command plain or preloaded ----

mode=plain
qm_env=()
failed=$tmp/failed
# P CMD ARGS...: runs CMD in the current mode; children inherit the preload. The first
# command that fails is recorded in $failed as "status<TAB>command".
P() {
  local s=0
  if [ "$mode" = plain ]; then
    "$@" || s=$?
  else
    env "${qm_env[@]}" "$@" || s=$?
  fi
  if [ $s -ne 0 ] && [ ! -e "$failed" ]; then
    printf '%d\t%s\n' "$s" "${*//$tmp/\$TMP}" >"$failed"
  fi
  return $s
}

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# Lines a preloaded run must not print (anywhere: stderr or an output file).
bad_re='qmalloc: (ERROR|WARNING)|cannot be preloaded|ld\.so: object'

# run_mode MODE: runs workload_$prog in $work with outputs in $tmp/out-MODE; sets rc, took.
run_mode() {
  mode=$1
  if [ "$mode" = plain ]; then
    qm_env=()
  else
    qm_env=("LD_PRELOAD=$lib")
    [ -z "$user_opts" ] || qm_env+=("QMALLOC_OPTIONS=$user_opts")
  fi
  out=$tmp/out-$mode
  failed=$tmp/failed-$mode
  rm -rf "$work" "$out" "$failed"
  mkdir -p "$work" "$out"
  local t0=$EPOCHREALTIME
  set +e
  (
    set -eE -o pipefail
    # shellcheck disable=SC2154 # s is set by the trap itself
    trap 's=$?; [ -e "$failed" ] || printf "%d\t%s\n" "$s" "$BASH_COMMAND" >"$failed"' ERR
    cd "$work"
    "workload_$prog"
  ) >"$out/stdout" 2>"$tmp/stderr-$mode"
  rc=$?
  set -e
  took=$(secs "$t0" "$EPOCHREALTIME")
  mv "$work" "$work-$mode"
  (cd "$out" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$tmp/manifest-$mode"
}

status_text() { # exit status -> "status N" or "signal NAME"
  if [ "$1" -gt 128 ] && kill -l "$(($1 - 128))" >/dev/null 2>&1; then
    echo "signal SIG$(kill -l "$(($1 - 128))")"
  else
    echo "status $1"
  fi
}

failure_text() { # failure_text RC: the command recorded in $failed and how it ended
  local st cmd
  if [ -s "$failed" ]; then
    IFS=$'\t' read -r st cmd <"$failed"
    echo "'$cmd' exited with $(status_text "$st")"
  else
    echo "exit $(status_text "$1")"
  fi
}

show_stderr() { # the end of a run's stderr, on stdout for the log
  if [ -s "$tmp/stderr-$1" ]; then
    echo "---- last lines of the $1 run's stderr ----"
    tail -n 15 "$tmp/stderr-$1"
    echo "----"
  fi
}

# proof: runs proof_$prog preloaded with verbose=1 and checks that at least $1 processes
# printed the strategy line, i.e. that the library was loaded and initialised.
proof() {
  local want=$1 log=$tmp/proof.log n
  mode=preload
  failed=$tmp/failed-proof
  qm_env=("LD_PRELOAD=$lib" "QMALLOC_OPTIONS=${user_opts:+$user_opts:}verbose=1")
  mkdir -p "$tmp/proof"
  set +e
  (
    set -e -o pipefail
    cd "$tmp/proof"
    "proof_$prog"
  ) >"$tmp/proof.out" 2>"$log"
  local prc=$?
  set -e
  if [ $prc -ne 0 ]; then
    tail -n 15 "$log"
    fail "preload check: the verbose preloaded run failed: $(failure_text $prc)"
  fi
  if grep -Eq "$bad_re" "$log"; then
    fail "preload check: $(grep -Em1 "$bad_re" "$log")"
  fi
  n=$(grep -c '^qmalloc: strategy' "$log" || true)
  if [ "$n" -lt "$want" ]; then
    tail -n 15 "$log"
    fail "preload check: $n of $want expected processes printed 'qmalloc: strategy'" \
      "(QMALLOC_OPTIONS=verbose=1): the library was not loaded"
  fi
  say "preload check: libqmalloc loaded and initialised in $n process(es):" \
    "$(grep -m1 '^qmalloc: strategy' "$log" | cut -d: -f2 | sed 's/^ //')"
}

# ---- python3 ----

gen_python3() {
  cat >"$gen/workload.py" <<'EOF'
# Allocation-heavy and deterministic: every line printed depends only on the seeds.
import bz2, difflib, hashlib, json, lzma, os, random, re, struct, sys, threading, zlib
import xml.etree.ElementTree as ET
from collections import Counter, OrderedDict, deque
from decimal import Decimal, getcontext

if hasattr(sys, "set_int_max_str_digits"):
    sys.set_int_max_str_digits(0)

def h(b):
    return hashlib.sha256(b).hexdigest()[:20]

def report(*a):
    print(*a, flush=True)

rng = random.Random(20240601)
# RUN_PROGRAMS_DIV divides every count (not the sizes, which straddle the thresholds)
DIV = int(os.environ.get("RUN_PROGRAMS_DIV", "1"))

def scaled(x):
    return max(1, x // DIV)

# lists: sorting, nesting, growth and shrinking one element at a time (the item array is
# reallocated across the large-chunk threshold, up to 16 MB)
nums = [rng.getrandbits(40) for _ in range(scaled(300_000))]
nums.sort()
report("list-sort", h(struct.pack("<%dQ" % len(nums), *nums)))
nested = [[i, str(i), i / 7, (i, i * 2)] for i in range(scaled(120_000))]
report("list-nested", h(repr(nested[::997]).encode()), sum(x[0] for x in nested))
del nested
grow = []
for i in range(scaled(1_500_000)):
    grow.append(i ^ 0x5555)
s = 0
while len(grow) > 1000:
    s += grow.pop()
report("list-grow", s, len(grow))
dq = deque(range(scaled(300_000)))
dq.rotate(12345)
report("deque", h(repr(list(dq)[:1000]).encode()))

# dicts and sets
d = {}
for i in range(scaled(250_000)):
    d["key-%012x" % rng.getrandbits(48)] = (i, rng.random())
for k in list(d)[::2]:
    del d[k]
d2 = {k: v[0] for k, v in d.items() if v[0] % 3}
report("dict", len(d), len(d2), h(repr(sorted(d2.items())[:5000]).encode()))
st = {rng.getrandbits(30) for _ in range(scaled(300_000))}
report("set", len(st), sum(st) % 1000003)
od = OrderedDict((i, str(i)) for i in range(scaled(100_000)))
for i in range(0, scaled(100_000), 3):
    od.move_to_end(i)
report("ordered", h(repr(list(od.items())[:2000]).encode()))
cnt = Counter(rng.randrange(scaled(5000)) for _ in range(scaled(500_000)))
report("counter", h(repr(cnt.most_common(50)).encode()))
del d, d2, st, od, cnt

# bytes around and above the 128 KiB threshold, freed in random order
sizes = (1000, 60_000, 131_055, 131_072, 131_073, 200_000, 500_000, 1_500_000, 4_000_000)
live = []
acc = hashlib.sha256()
for i in range(300):
    n = rng.choice(sizes)
    b = rng.randbytes(n)
    acc.update(b[:64] + b[-64:])
    live.append(b)
    if len(live) > 40:
        live.pop(rng.randrange(len(live)))
report("bytes", acc.hexdigest()[:20], sum(len(b) for b in live))
ba = bytearray()
for i in range(scaled(3000)):
    ba += rng.randbytes(rng.randrange(1, 3000))
report("bytearray-grow", len(ba), h(bytes(ba)))
del ba[len(ba) // 3:]
ba.extend(b"x" * 700_000)
del ba[:100_000]
report("bytearray-shrink", len(ba), h(bytes(ba)))
big = b"".join(live[:20])
rep = big.replace(b"\x00", b"\x00\x01")
hx = big[:2_000_000].hex()
report("bytes-ops", len(big), h(rep), len(big.split(b"\xff")), bytes.fromhex(hx) == big[:2_000_000])
mv = memoryview(big)
report("memoryview", h(bytes(mv[1000:900_000])), h(bytes(mv[::3])))
del live, big, rep, hx, mv, ba

# strings and regular expressions
txt = "".join("%d:%.6f;" % (i, rng.random()) for i in range(scaled(300_000)))
parts = txt.split(";")
report("str", len(txt), len(parts), h(txt.encode()), h(txt.upper().encode()))
report("re", len(re.findall(r"(\d+):0\.(\d\d)", txt)), h(re.sub(r"\d{3}", "#", txt).encode()))
report("str-join", h("\n".join(reversed(parts)).encode()))
del txt, parts

# big integers and decimals
x = pow(3, scaled(250_000))
report("bigint", h(str(x).encode()), h(hex(x * x).encode()))
getcontext().prec = 3000
report("decimal", h(str(Decimal(2).sqrt() + Decimal(3).ln()).encode()))

# json, xml, difflib
obj = {"items": [{"id": i, "name": "n%d" % i, "tags": [str(j) for j in range(i % 7)]}
                 for i in range(scaled(60_000))]}
js = json.dumps(obj, sort_keys=True)
report("json", len(js), h(js.encode()), json.loads(js) == obj)
root = ET.Element("root")
for i in range(scaled(30_000)):
    e = ET.SubElement(root, "item", id=str(i))
    e.text = "value %d" % (i * 7)
xs = ET.tostring(root)
report("xml", len(xs), h(xs), len(ET.fromstring(xs).findall("item")))
a = ["line %d %d\n" % (i, rng.randrange(10)) for i in range(scaled(4000))]
b = [l if rng.randrange(9) else "changed\n" for l in a]
report("difflib", h("".join(difflib.unified_diff(a, b)).encode()))
del obj, js, root, xs, a, b

# compression in threads: zlib, lzma and bz2 release the GIL and allocate in C, so the
# threads really allocate and free concurrently; results are printed in thread order
def worker(idx, results):
    r = random.Random(1000 + idx)
    acc = hashlib.sha256()
    keep = []
    for j in range(20):
        n = r.choice((5_000, 100_000, 140_000, 300_000, 1_000_000))
        data = r.randbytes(256) * (n // 256)
        c = zlib.compress(data, 6)
        assert zlib.decompress(c) == data
        acc.update(c)
        if j % 6 == 0:
            c = lzma.compress(data[:300_000], preset=1)
            assert lzma.decompress(c) == data[:300_000]
            acc.update(c)
        if j % 7 == 3:
            c = bz2.compress(data[:200_000], 9)
            assert bz2.decompress(c) == data[:200_000]
            acc.update(c)
        lst = sorted(r.random() for _ in range(scaled(20_000)))
        acc.update(struct.pack("<d", sum(lst)))
        keep.append(data)
        if len(keep) > 6:
            keep.pop(0)
    results[idx] = acc.hexdigest()[:20]

def child_work(seed):
    # zlib's crc32 only: a library lock held by a parent thread at fork would hang the child
    r = random.Random(seed)
    blobs = [r.randbytes(r.choice((100, 4000, 150_000, 600_000))) for _ in range(scaled(200))]
    d = {i: r.random() for i in range(scaled(100_000))}
    return "%08x" % zlib.crc32(b"".join(blobs[::7]) + repr(sorted(d.items())[:100]).encode())

results = [None] * 4
threads = [threading.Thread(target=worker, args=(i, results)) for i in range(4)]
for t in threads:
    t.start()
# fork while the threads allocate: the child must find the allocator usable
children = []
for k in range(3):
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            os.write(wfd, child_work(500 + k).encode())
            os._exit(0)
        except BaseException:
            os._exit(3)
    os.close(wfd)
    children.append((pid, rfd, child_work(500 + k)))
for t in threads:
    t.join()
for i, res in enumerate(results):
    report("thread", i, res)
for k, (pid, rfd, expect) in enumerate(children):
    with os.fdopen(rfd, "rb") as f:
        got = f.read().decode()
    _, status = os.waitpid(pid, 0)
    report("fork", k, os.waitstatus_to_exitcode(status), got == expect, got)
report("done")
EOF
}

python_env() {
  unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONWARNINGS PYTHONMALLOC PYTHONDEVMODE
  export PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 PYTHONNOUSERSITE=1
}

workload_python3() {
  python_env
  # PYTHONMALLOC=malloc sends every object through malloc (pymalloc's arenas are mmap()ed
  # and would hide the small objects); the second pass is the interpreter's default.
  # RUN_PROGRAMS_QUICK=1 (guard_all runs: every malloc a guarded slot, ~47x slower in the
  # malloc pass) keeps the default pass only, where objects above 512 bytes still use malloc
  if [ "${RUN_PROGRAMS_QUICK:-0}" != 1 ]; then
    PYTHONMALLOC=malloc P "$py" -s "$gen/workload.py" >"$out/malloc.txt"
    grep -q '^done$' "$out/malloc.txt"
  fi
  P "$py" -s "$gen/workload.py" >"$out/pymalloc.txt"
  grep -q '^done$' "$out/pymalloc.txt"
}

proof_python3() {
  python_env
  P "$py" -s -c 'import hashlib; print(len(bytes(300000)))'
}

# ---- sqlite3 ----

gen_sqlite3() {
  awk -v div="$div" '
    function rnd(n) { seed = (seed * 16807) % 2147483647; return seed % n }
    function word() { return w[1 + rnd(nw)] }
    BEGIN {
      seed = 987654
      nw = split("amber birch cedar delta ember fjord grove harbor iris juniper kelp lumen " \
                 "maple nectar onyx pepper quartz raven sierra thistle umber violet willow " \
                 "xenon yarrow zephyr", w, " ")
      nc = split("Aarhus Bergen Cork Dresden Espoo Faro Graz Hamburg Innsbruck Jena Kaunas " \
                 "Lille Malmo Nantes Oulu Porto Riga Split Tartu Uppsala Vigo Wroclaw Zadar", city, " ")
      nk = split("tools garden kitchen books music toys sports office auto pets health games", cat, " ")
      print "PRAGMA page_size = 4096;"
      print "PRAGMA cache_size = -32768;"
      print "CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL, joined INT, credit INT);"
      print "CREATE TABLE products(id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price INT NOT NULL);"
      print "CREATE TABLE orders(id INTEGER PRIMARY KEY, customer INT NOT NULL REFERENCES customers(id), product INT NOT NULL REFERENCES products(id), qty INT, day INT, note TEXT);"
      print "CREATE TABLE docs(id INTEGER PRIMARY KEY, title TEXT, body TEXT);"
      print "BEGIN;"
      nc_rows = int(10000 / div); np_rows = int(2000 / div); nt = int(10 / div); if (nt < 1) nt = 1
      no_rows = int(100000 / div / nt)
      for (i = 1; i <= nc_rows; i++)
        printf "INSERT INTO customers VALUES(%d,%c%s %s%c,%c%s%c,%d,%d);\n", i, 39, word(), word(), 39, 39, city[1 + rnd(nc)], 39, 18000 + rnd(2000), rnd(100000)
      print "COMMIT;"
      print "BEGIN;"
      for (i = 1; i <= np_rows; i++)
        printf "INSERT INTO products VALUES(%d,%c%s-%d%c,%c%s%c,%d);\n", i, 39, word(), i, 39, 39, cat[1 + rnd(nk)], 39, 99 + rnd(50000)
      print "COMMIT;"
      for (t = 0; t < nt; t++) {
        print "BEGIN;"
        for (i = 1; i <= no_rows; i++) {
          n = 1 + rnd(8); note = word(); for (k = 1; k < n; k++) note = note " " word()
          printf "INSERT INTO orders VALUES(%d,%d,%d,%d,%d,%c%s%c);\n", t * no_rows + i, 1 + rnd(nc_rows), 1 + rnd(np_rows), 1 + rnd(20), rnd(730), 39, note, 39
        }
        print "COMMIT;"
      }
    }' >"$gen/load.sql"
  cat >"$gen/queries.sql" <<EOF
.headers on
.mode list
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $((40 / div > 4 ? 40 / div : 4)))
INSERT INTO docs SELECT i, 'doc ' || i,
  replace(hex(zeroblob(60000 + i * 20000)), '0', char(65 + i % 26)) || printf('%.*c', i * 1000, 'z')
FROM n;
COMMIT;
UPDATE docs SET body = body || body || 'tail' WHERE id % 3 = 0;
SELECT id, length(body), substr(body, 5000, 8), length(replace(body, char(65 + id % 26), 'xy'))
  FROM docs ORDER BY id;
CREATE INDEX orders_customer ON orders(customer);
CREATE INDEX orders_product_day ON orders(product, day);
CREATE INDEX customers_city ON customers(city);
CREATE INDEX orders_note ON orders(note);
ANALYZE;
SELECT c.city, count(*) AS n, sum(o.qty * p.price) AS revenue
  FROM orders o JOIN customers c ON c.id = o.customer JOIN products p ON p.id = o.product
  GROUP BY c.city ORDER BY revenue DESC;
SELECT p.category, o.day / 30 AS month, count(*), sum(o.qty), round(avg(o.qty), 4)
  FROM orders o JOIN products p ON p.id = o.product
  GROUP BY p.category, month ORDER BY p.category, month;
SELECT customer, total, rank FROM (
  SELECT customer, sum(qty) AS total, rank() OVER (ORDER BY sum(qty) DESC, customer) AS rank
  FROM orders GROUP BY customer) WHERE rank <= 50;
SELECT note, count(*) FROM orders GROUP BY note HAVING count(*) > 3 ORDER BY count(*) DESC, note LIMIT 100;
SELECT length(group_concat(note, ',')), count(DISTINCT note) FROM orders;
SELECT hex(sha3_query('SELECT * FROM orders ORDER BY note, id'));
SELECT hex(sha3_query('SELECT o.id, c.name, p.name FROM orders o, customers c, products p WHERE c.id = o.customer AND p.id = o.product ORDER BY c.name, p.name, o.id'));
SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM customers c WHERE c.id = o.customer);
BEGIN;
UPDATE orders SET qty = qty + 1, note = note || ' again' WHERE day % 7 = 0;
DELETE FROM orders WHERE id % 10 = 0;
DELETE FROM docs WHERE id % 4 = 1;
CREATE TABLE summary AS SELECT customer, count(*) AS n, sum(qty) AS q, group_concat(product) AS ps
  FROM orders GROUP BY customer;
COMMIT;
VACUUM;
PRAGMA integrity_check;
PRAGMA foreign_key_check;
SELECT count(*), sum(qty), sum(length(note)), max(day) FROM orders;
SELECT count(*), sum(length(body)) FROM docs;
SELECT hex(sha3_query('SELECT * FROM summary ORDER BY customer'));
EOF
}

workload_sqlite3() {
  export SQLITE_TMPDIR=$work
  P sqlite3 -bail -batch shop.db <"$gen/load.sql" >"$out/load.txt"
  P sqlite3 -bail -batch shop.db <"$gen/queries.sql" >"$out/queries.txt"
  grep -qx ok "$out/queries.txt"
  P sqlite3 -batch shop.db .dump >dump.sql
  sha256sum <dump.sql >"$out/dump.sha256"
  P sqlite3 -bail -batch copy.db <dump.sql >"$out/reload.txt"
  P sqlite3 -batch shop.db '.sha3sum --schema' >"$out/shop.sha3"
  P sqlite3 -batch copy.db '.sha3sum --schema' >"$out/copy.sha3"
  cmp -s "$out/shop.sha3" "$out/copy.sha3"
  sha256sum shop.db >"$out/db.sha256"
}

proof_sqlite3() { P sqlite3 -batch :memory: 'select length(zeroblob(300000));'; }

# ---- git ----

# gen_tree VERSION DIR: the main line's files (src/, data/) at a version; ~280 text files
# and three large ones, where each version rewrites some lines of some files, adds a few
# files and deletes others.
gen_tree() {
  local d
  mkdir -p "$2/data"
  for d in 0 1 2 3 4 5 6 7 8 9 10 11 12 13; do mkdir -p "$2/src/mod$d"; done
  for ((d = 2; d <= $1; d++)); do mkdir -p "$2/src/new$d"; done
  (cd "$2" && awk -v ver="$1" -v div="$div" '
    function hsh(a, b, c, d) { return (a * 7919 + b * 104729 + c * 1299709 + d * 15485863) % 1000003 }
    function changed(f, l,   u, g) { # last version <= ver that rewrote line l of file f
      g = 0
      for (u = 1; u <= ver; u++)
        if ((f * 7 + u * 3) % 5 == 0 && (f * 131 + l * 31 + u * 17) % 23 == 0) g = u
      return g
    }
    function emit(path, f, nl,   l, g, k, s) {
      for (l = 0; l < nl; l++) {
        g = changed(f, l); s = ""
        for (k = 0; k < 6; k++) s = s w[1 + hsh(f, l, g, k) % nw] " "
        print s hsh(f, l, g, 9) > path
      }
      close(path)
    }
    BEGIN {
      nw = split("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima " \
                 "mike november oscar papa quebec romeo sierra tango uniform victor whiskey " \
                 "xray yankee zulu one two three four five six seven eight nine zero", w, " ")
      for (f = 0; f < int(280 / div); f++) {
        gone = 0
        for (u = 3; u <= ver; u++) if ((f * 11 + u) % 37 == 0) gone = 1
        if (!gone) emit("src/mod" (f % 14) "/file" f ".txt", f, 40 + (f * 37) % 400)
      }
      for (u = 2; u <= ver; u++)
        for (k = 0; k < 4; k++) emit("src/new" u "/added" k ".txt", 1000 + u * 10 + k, 200)
      for (k = 0; k < 3; k++) emit("data/big" k ".txt", 2000 + k, int((15000 + k * 12000) / div))
    }')
}

# gen_side NAME DIR N: the files a side branch adds (only under NAME/) at its commit N
gen_side() {
  mkdir -p "$2/$1"
  (cd "$2/$1" && awk -v n="$3" -v name="$1" -v div="$div" 'BEGIN {
      for (i = 0; i < 10 * n / div; i++) {
        p = name i ".txt"
        for (l = 0; l < 300; l++) print name, n, i, l, (i * 7919 + l * 104729 + n) % 65521 > p
        close(p)
      }
    }')
}

gen_git() {
  local v k
  for v in 1 2 3 4 5 6 7 8; do gen_tree "$v" "$gen/main$v"; done
  for k in 1 2; do
    gen_side feature "$gen/feature$k" "$k"
    gen_side topic "$gen/topic$k" "$k"
  done
}

commit_n=0
G() { P git -c gc.auto=0 -c maintenance.auto=false -c core.autocrlf=false "$@"; }
gcommit() { # gcommit MESSAGE: commits everything with the next fixed date
  commit_n=$((commit_n + 1))
  local date="$((1700000000 + commit_n * 3600)) +0000"
  G add -A
  GIT_AUTHOR_DATE=$date GIT_COMMITTER_DATE=$date G commit -q -m "$1"
}
sync_main() { rm -rf src data && cp -R "$gen/main$1/." .; }
sync_side() { rm -rf "$1" && cp -R "$gen/$1$2/." .; }

git_env() {
  export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0
  export GIT_AUTHOR_NAME='Test Author' GIT_AUTHOR_EMAIL=author@example.com
  export GIT_COMMITTER_NAME='Test Committer' GIT_COMMITTER_EMAIL=committer@example.com
  export GIT_AUTHOR_DATE='1700000000 +0000' GIT_COMMITTER_DATE='1700000000 +0000'
  unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY
}

workload_git() {
  git_env
  local v k
  G init -q -b main repo
  cd repo
  for v in 1 2 3; do sync_main $v && gcommit "main $v"; done
  G tag -a v0.3 -m 'release 0.3'
  G switch -q -c feature
  for k in 1 2; do sync_side feature $k && gcommit "feature $k"; done
  G switch -q main
  for v in 4 5; do sync_main $v && gcommit "main $v"; done
  G switch -q -c topic
  for k in 1 2; do sync_side topic $k && gcommit "topic $k"; done
  G switch -q main
  sync_main 6 && gcommit "main 6"
  commit_n=$((commit_n + 1))
  GIT_COMMITTER_DATE="$((1700000000 + commit_n * 3600)) +0000" G merge -q --no-ff -m 'merge feature' feature
  for v in 7 8; do sync_main $v && gcommit "main $v"; done
  G switch -q topic
  commit_n=$((commit_n + 1))
  GIT_COMMITTER_DATE="$((1700000000 + commit_n * 3600)) +0000" G rebase -q main
  G switch -q main
  commit_n=$((commit_n + 1))
  GIT_COMMITTER_DATE="$((1700000000 + commit_n * 3600)) +0000" G merge -q --no-ff -m 'merge topic' topic
  G tag -a v1.0 -m 'release 1.0'
  G gc --quiet
  G repack -a -d -f -q --window=50 --depth=30
  G log --all --graph --stat -M --format=fuller >"$out/log.txt"
  G log -p -M main~3..main >"$out/log-patch.txt"
  G rev-list --all --objects >objects.txt
  sort objects.txt >"$out/objects.txt"
  G fsck --full --strict --no-progress --no-dangling >"$out/fsck.txt" 2>&1
  G count-objects -v >count.txt
  grep -E '^(count|in-pack|packs|garbage):' count.txt >"$out/count.txt"
  G cat-file --batch-check --batch-all-objects >"$out/batch-check.txt"
  G archive --format=tar v1.0 >v1.0.tar
  sha256sum <v1.0.tar >"$out/archive.sha256"
  G diff --stat v0.3 v1.0 >"$out/diffstat.txt"
  G diff v0.3 v1.0 >diff.txt
  sha256sum <diff.txt >"$out/diff.sha256"
  G blame -s src/mod1/file15.txt >"$out/blame.txt"
  G grep -c kilo v1.0 >"$out/grep.txt"
  G show-ref >"$out/refs.txt"
  G clone -q --no-local . ../clone
  G -C ../clone fsck --full --strict --no-progress >"$out/clone-fsck.txt" 2>&1
  G -C ../clone log --format='%H %T %P %s' --all >"$out/clone-log.txt"
  G -C ../clone rev-parse HEAD 'HEAD^{tree}' >"$out/clone-head.txt"
}

proof_git() {
  git_env
  G init -q repo
  echo hello >repo/file
  G -C repo add file
  G -C repo commit -q -m proof
  G -C repo gc --quiet
}

# ---- gcc ----

gen_gcc() {
  awk -v div="$div" '
    function rnd(n) { seed = (seed * 16807) % 2147483647; return seed % n }
    function k32() { return sprintf("0x%08xu", rnd(2147483647) * 2 + rnd(2)) }
    BEGIN {
      seed = 31337; nf = int(120 / div); if (nf < 8) nf = 8
      print "/* generated: a deterministic program for the compiler test */"
      print "#include <stdint.h>\n#include <stdio.h>\n#include <string.h>\n"
      for (t = 0; t < 8; t++) {
        printf "static const uint32_t tab%d[256] = {\n", t
        for (i = 0; i < 256; i += 8) {
          s = "  "
          for (j = 0; j < 8; j++) s = s k32() ","
          print s
        }
        print "};"
      }
      print "struct rec { uint32_t a; uint16_t b; uint8_t c[6]; const char *name; };"
      print "static const struct rec recs[128] = {"
      for (i = 0; i < 128; i++)
        printf "  {%s, %du, {%d, %d, %d, %d, %d, %d}, \"rec_%d_%d\"},\n", k32(), rnd(65536), rnd(256), rnd(256), rnd(256), rnd(256), rnd(256), rnd(256), i, rnd(100000)
      print "};\n"
      for (f = 0; f < nf; f++) {
        printf "static uint32_t f%d(uint32_t x, uint32_t y) {\n", f
        printf "  uint32_t acc = %s, t = y;\n", k32()
        printf "  unsigned char buf[%d];\n", 16 + rnd(48)
        printf "  memset(buf, %d, sizeof buf);\n", rnd(256)
        printf "  for (unsigned i = 0; i < %du; i++) {\n", 4 + rnd(60)
        ns = 6 + rnd(10)
        for (s = 0; s < ns; s++) {
          kind = rnd(7)
          if (kind == 0) printf "    acc ^= (x * %s) + (y >> %d);\n", k32(), 1 + rnd(31)
          else if (kind == 1) { r = 1 + rnd(31); printf "    x = (x << %d) | (x >> %d);\n", r, 32 - r }
          else if (kind == 2) printf "    acc += tab%d[(acc ^ i) & 255u];\n", rnd(8)
          else if (kind == 3) printf "    buf[(i + %du) %% sizeof buf] ^= (unsigned char)(acc >> %d);\n", rnd(97), rnd(24)
          else if (kind == 4) {
            print "    switch ((acc + i) & 7u) {"
            for (c = 0; c < 7; c++) printf "    case %d: t = t * %s + %du; break;\n", c, k32(), rnd(1000)
            print "    default: t ^= acc; break;\n    }"
          }
          else if (kind == 5) printf "    if ((x & %s) > (y | %s)) acc -= t; else acc += t ^ %s;\n", k32(), k32(), k32()
          else printf "    y = y * %s + recs[(x ^ i) & 127u].a + recs[i & 127u].c[i %% 6u];\n", k32()
        }
        print "  }"
        print "  for (unsigned k = 0; k < sizeof buf; k++)\n    acc = acc * 31u + buf[k];"
        if (f > 0 && rnd(3) == 0) printf "  acc ^= f%d(acc, x);\n", rnd(f)
        print "  return acc ^ t ^ y;\n}\n"
      }
      print "static uint32_t (*const fns[])(uint32_t, uint32_t) = {"
      for (f = 0; f < nf; f++) printf "  f%d,\n", f
      print "};\n"
      print "int main(void) {"
      print "  uint32_t total = 0;"
      print "  for (unsigned i = 0; i < sizeof fns / sizeof fns[0]; i++) {"
      print "    uint32_t r = fns[i](i * 2654435761u, total);"
      print "    total = total * 1000003u ^ r;"
      print "    printf(\"f%u %08x\\n\", i, (unsigned)r);"
      print "  }"
      print "  for (unsigned i = 0; i < 128; i++)"
      print "    printf(\"%s %u %u\\n\", recs[i].name, (unsigned)recs[i].b, (unsigned)recs[i].c[i % 6u]);"
      print "  printf(\"total %08x\\n\", (unsigned)total);"
      print "  return 0;\n}"
    }' >"$gen/prog.c"
}

workload_gcc() {
  cp "$gen/prog.c" prog.c
  P gcc -std=c11 -O2 -Wall -Wextra -c prog.c -o prog-O2.o 2>"$out/warnings-O2.txt"
  P gcc -std=c11 -O0 -g -c prog.c -o prog-O0g.o
  P gcc -std=c11 -O3 -funroll-loops -S prog.c -o prog-O3.s
  P gcc prog-O2.o -o prog-O2
  P gcc -g prog-O0g.o -o prog-O0g
  P gcc -E prog.c -o prog.i
  ./prog-O2 >"$out/run-O2.txt"
  ./prog-O0g >"$out/run-O0g.txt"
  cmp -s "$out/run-O2.txt" "$out/run-O0g.txt"
  cp prog-O2.o prog-O0g.o prog-O3.s prog-O2 prog-O0g prog.i "$out/"
}

proof_gcc() {
  printf 'int main(void) { return 0; }\n' >proof.c
  P gcc -c proof.c -o proof.o
}

# ---- compress: xz and zstd ----

gen_compress() {
  # 10 MiB (divided by div) of log-like text from an LCG, then ten variants of it through
  # different character permutations: 100 MiB, not one long repetition
  awk -v size=$((10485760 / div)) 'function rnd(n) { seed = (seed * 16807) % 2147483647; return seed % n }
    BEGIN {
      seed = 42; total = 0
      while (total < size) {
        line = sprintf("2024-01-%02d %02d:%02d:%02d host%03d svc%02d[%d]: word%d word%d value=%d", 1 + rnd(28), rnd(24), rnd(60), rnd(60), rnd(200), rnd(40), rnd(65536), rnd(500), rnd(500), rnd(1000))
        line = line "\n"
        if (total + length(line) > size) line = substr(line, 1, size - total)
        printf "%s", line
        total += length(line)
      }
    }' >"$gen/chunk"
  local perms=(0123456789abcdef 1234567890bcdefa 2345678901cdefab 3456789012defabc
    4567890123efabcd 5678901234fabcde 6789012345abcdef 7890123456bcdefa
    8901234567cdefab 9012345678defabc)
  local p
  for p in "${perms[@]}"; do tr '0-9a-f' "$p" <"$gen/chunk"; done >"$gen/data"
  rm -f "$gen/chunk"
  sha256sum <"$gen/data" | cut -c1-64 >"$gen/data.sha256"
}

roundtrip() { # roundtrip NAME CMD...: decompresses to stdout and checks the original's hash
  local name=$1 got
  shift
  got=$(P "$@" | sha256sum | cut -c1-64)
  echo "$name $got" >>"$out/roundtrip.txt"
  [ "$got" = "$(cat "$gen/data.sha256")" ] || {
    echo "$name: decompressed data differs from the input" >&2
    return 1
  }
}

workload_compress() {
  ln "$gen/data" data
  P xz -T2 -1 -k -q data
  P xz -t data.xz
  P xz --robot -l data.xz | grep -v '^name' >"$out/xz-list.txt"
  roundtrip xz-file xz -d -c -q data.xz
  roundtrip xz-stdin xz -d -T2 -c -q <data.xz
  P zstd -T2 -3 -q data -o data.zst
  P zstd -T2 -6 --long=27 -q -c <data >long.zst
  P zstd -t -q data.zst
  roundtrip zstd-file zstd -d -q -c data.zst
  roundtrip zstd-long zstd -d --long=27 -q -c long.zst
  P zstd -d -q data.zst -o decoded
  cmp -s data decoded
  rm -f decoded
  sha256sum data.xz data.zst long.zst >"$out/compressed.sha256"
  wc -c data.xz data.zst long.zst >"$out/sizes.txt"
}

proof_compress() {
  printf 'proof\n' | P xz -c | P xz -d -c >/dev/null
  printf 'proof\n' | P zstd -q -c | P zstd -d -q -c >/dev/null
}

# ---- sort ----

gen_sort() {
  # ~2.9 M lines (divided by div), ~75 MB: word-word keys of mixed case, a signed number,
  # a decimal, and one line in eight repeated
  awk -v lines=$((2600000 / div)) 'function rnd(n) { seed = (seed * 16807) % 2147483647; return seed % n }
    BEGIN {
      seed = 777
      nw = split("alpha Alpha bravo BRAVO charlie delta Delta echo foxtrot golf Golf hotel " \
                 "india juliet Juliet kilo lima mike Mike november oscar papa quebec romeo " \
                 "Romeo sierra tango uniform victor whiskey xray yankee zulu", w, " ")
      for (i = 0; i < lines; i++) {
        line = sprintf("%s-%s%d\t%d\t%d.%03d", w[1 + rnd(nw)], w[1 + rnd(nw)], rnd(1000), rnd(2000000) - 1000000, rnd(100000), rnd(1000))
        print line
        if (rnd(8) == 0) print line
      }
    }' >"$gen/lines"
}

sorted() { # sorted NAME SORT-ARGS...: sorts the input into NAME, records its hash
  P sort "${@:2}" "$gen/lines" >"$1"
  echo "$1 $(sha256sum <"$1" | cut -c1-64) $(wc -l <"$1")" >>"$out/sorted.txt"
}
drop() { rm -f "$@"; } # outputs only their hash is kept of (the disk may be a tmpfs)

workload_sort() {
  mkdir -p sort-tmp
  # buffers below the input's size (divided with it): sort merges through temporary files
  local t=$'\t' big=$((51200 / div))K small=$((8192 / div))K
  sorted plain -S "$big" -T sort-tmp
  sorted small-buffer -S "$small" --batch-size=3 -T sort-tmp
  drop small-buffer
  sorted numeric -t "$t" -k2,2n -k1,1 -S "$big" -T sort-tmp --parallel=2
  sorted unique -u
  sorted unique-key -u -t "$t" -k1,1
  sorted reverse-stable -s -t "$t" -k3,3nr --parallel=2
  sorted fold-case -f -k1,1 -S "$big" -T sort-tmp
  drop unique-key reverse-stable fold-case
  P sort -c plain
  P sort -c -t "$t" -k2,2n -k1,1 numeric
  P sort -m -u plain unique >merged
  cmp -s merged unique
  drop merged plain numeric
  # a UTF-8 locale when there is one (sorting through strcoll and strxfrm)
  if locale -a 2>/dev/null | grep -qix 'c.utf-\?8'; then
    LC_ALL=C.UTF-8 P sort -S "$big" -T sort-tmp -k1,1 -k2,2n "$gen/lines" >utf8
    echo "utf8 $(sha256sum <utf8 | cut -c1-64)" >>"$out/sorted.txt"
    drop utf8
  fi
}

proof_sort() { printf 'b\na\n' | P sort >/dev/null; }

# ---- the test ----

case $prog in # processes the preload check must see initialise the library
  git) proof_min=4 ;;      # init, add, commit, gc (and gc's children)
  gcc) proof_min=3 ;;      # the driver, cc1 and as
  compress) proof_min=4 ;; # xz and zstd, each compressing and decompressing
  *) proof_min=1 ;;
esac

say "generating inputs in $tmp"
t0=$EPOCHREALTIME
"gen_$prog"
say "inputs ready ($(du -sh "$gen" | cut -f1), $(secs "$t0" "$EPOCHREALTIME") s)"

proof "$proof_min"

run_mode plain
plain_rc=$rc plain_took=$took
say "plain run: $plain_took s, exit $(status_text "$plain_rc")"
if [ "$plain_rc" -ne 0 ]; then
  show_stderr plain
  failed=$tmp/failed-plain
  fail "the plain run failed (not a qmalloc problem: the test's environment):" \
    "$(failure_text "$plain_rc")"
fi

run_mode preload
pre_rc=$rc pre_took=$took
say "preloaded run: $pre_took s, exit $(status_text "$pre_rc")"

bad=$(grep -Eah "$bad_re" "$tmp/stderr-preload" 2>/dev/null | head -n 1 || true)
[ -n "$bad" ] || bad=$(grep -Earh "$bad_re" "$tmp/out-preload" 2>/dev/null | head -n 1 || true)
if [ "$pre_rc" -ne 0 ]; then
  show_stderr preload
  failed=$tmp/failed-preload
  fail "preloaded run failed: $(failure_text "$pre_rc")${bad:+; it printed: $bad}"
fi
if [ -n "$bad" ]; then
  show_stderr preload
  fail "preloaded run printed: $bad"
fi
if ! cmp -s "$tmp/manifest-plain" "$tmp/manifest-preload"; then
  echo "---- outputs: plain vs preloaded ----"
  diff "$tmp/manifest-plain" "$tmp/manifest-preload" || true
  echo "----"
  differ=$(diff "$tmp/manifest-plain" "$tmp/manifest-preload" | sed -n 's/^[<>] [0-9a-f]*  \.\///p' |
    sort -u | tr '\n' ' ')
  fail "outputs differ between the plain and the preloaded run: $differ"
fi

n=$(wc -l <"$tmp/manifest-plain")
ratio=$(awk -v a="$plain_took" -v b="$pre_took" 'BEGIN { printf "%.2f", (a > 0 ? b / a : 0) }')
say "$n outputs identical; plain $plain_took s, preloaded $pre_took s (x$ratio)"
say PASS
