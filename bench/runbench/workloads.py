"""The workloads: the parameters of each mode, the benchmarks as a table of
definitions (program, configurations, arguments, who runs them), the real
programs and the planted bugs."""

import os
import shutil


# ---- parameters of the modes ------------------------------------------

MODES = {
    "quick": {
        "rounds": 3,
        "seed_ms": 40,
        "seed_sizes": [128, 1024, 8192],
        "large_configs": [(8, 1, "page"), (64, 1, "page"), (8, 2, "page")],
        "large_ops": 10 ** 9,  # bounded by time: every allocator gets the same window
        "large_ms": 250,
        "large_warm": 600,
        "large_warm_ms": 1200,
        # qmalloc keeps state across frees: its window fills only after 32 MiB
        # of frees, so its warm-up and timed phase are counted in ops
        "qm_warm": 1500,
        "qm_ops": 600,
        "efence_configs": [(8, 1, "page")],
        "small_ops": 10 ** 10,
        "small_ms": 200,
        # threads that pass blocks: hand-off's untimed generations first; the
        # phases run is fixed work (churn ops per thread per phase), not timed
        "handoff_warm_gens": 2,
        "phase_ops": 30000,
        # small churn T=1 with every allocation guarded (Electric Fence, DUMA,
        # qmalloc guard_all=1): they run at about 1,000 ops/s, so a shorter
        # warm-up and a longer timed phase than the others' 200,000 ops
        "guarded_warm": 2000,
        "guarded_ms": 1500,
        "realloc_reps": 10,
        "realloc_ms": 300,
        "realloc_cap_ms": 1000,
        # record runs: every call timed and every address logged (reuse
        # distance, latency), a fixed number of ops after the warm-up
        "record_rounds": 1,
        "record_configs": [(8, 1, "page")],
        "record_ops": 1000,
        "record_warm": 600,
        "small_record_threads": [1],
        "small_record_ops": 200000,
        "cold_rounds": 1,
        "cold_ops": 300,
        # real programs: python3 dict ops, sqlite3 rows, gcc functions compiled
        "prog_py": 200000,
        "prog_sql": 100000,
        "prog_cc": 600,
    },
    "smoke": {  # checks the driver itself, numbers meaningless
        "rounds": 1,
        "seed_ms": 5,
        "seed_sizes": [128],
        "large_configs": [(8, 1, "page")],
        "large_ops": 50,
        "large_ms": 50,
        "large_warm": 8,
        "large_warm_ms": 50,
        # qmalloc keeps state across frees: its window fills only after 32 MiB
        # of frees, so its warm-up and timed phase are counted in ops
        "qm_warm": 8,
        "qm_ops": 50,
        "efence_configs": [(8, 1, "page")],
        "small_ops": 100000,
        "small_ms": 50,
        # threads that pass blocks: hand-off's untimed generations first; the
        # phases run is fixed work (churn ops per thread per phase), not timed
        "handoff_warm_gens": 1,
        "phase_ops": 2000,
        "guarded_warm": 100,
        "guarded_ms": 50,
        "realloc_reps": 1,
        "realloc_ms": 50,
        "realloc_cap_ms": 200,
        "record_rounds": 1,
        "record_configs": [(8, 1, "page")],
        "record_ops": 50,
        "record_warm": 8,
        "small_record_threads": [1],
        "small_record_ops": 10000,
        "cold_rounds": 1,
        "cold_ops": 30,
        "prog_py": 2000,
        "prog_sql": 1000,
        "prog_cc": 20,
    },
    "full": {
        "rounds": 5,
        "seed_ms": 200,
        "seed_sizes": [128, 1024, 8192],
        "large_configs": [(w, t, touch) for touch in ("page", "full") for t in (1, 2)
                          for w in (1, 8, 64)],
        "large_ops": 10 ** 9,
        "large_ms": 500,
        "large_warm": 800,
        "large_warm_ms": 1500,
        # qmalloc keeps state across frees: its window fills only after 32 MiB
        # of frees, so its warm-up and timed phase are counted in ops
        "qm_warm": 1500,
        "qm_ops": 1000,
        "efence_configs": [(w, 1, touch) for touch in ("page", "full") for w in (1, 8, 64)],
        "small_ops": 10 ** 10,
        "small_ms": 800,
        # threads that pass blocks: hand-off's untimed generations first; the
        # phases run is fixed work (churn ops per thread per phase), not timed
        "handoff_warm_gens": 4,
        "phase_ops": 50000,
        "guarded_warm": 5000,
        "guarded_ms": 4000,
        "realloc_reps": 30,
        "realloc_ms": 600,
        "realloc_cap_ms": 3000,
        "record_rounds": 3,
        "record_configs": [(8, 1, "page"), (64, 1, "page"), (8, 2, "page")],
        "record_ops": 2000,
        "record_warm": 800,
        "small_record_threads": [1, 2],
        "small_record_ops": 500000,
        "cold_rounds": 3,
        "cold_ops": 300,
        "prog_py": 600000,
        "prog_sql": 300000,
        "prog_cc": 2000,
    },
}


SEED_METHODS = ["write", "mprotect", "mprotect-thp", "dontneed", "qm-protect", "qm-discard",
                "qm-guard", "qm-unmap"]
SEED_TOUCH = ["all", "0", "1"]
REFERENCE = "jemalloc"
# Electric Fence pays a fault per page: its record runs are shorter
EFENCE_RECORD_OPS, EFENCE_RECORD_WARM = 300, 50


# ---- the benchmarks --------------------------------------------------------


PY_SCRIPT = """import random, sys
random.seed(1)
n = int(sys.argv[1])
d = {}
for i in range(n):
    k = "k%d" % random.randrange(n // 3 + 1)
    d[k] = [i, str(i), (i, i)]
    if i % 3 == 0:
        d.pop("k%d" % random.randrange(n // 3 + 1), None)
print(len(d), sum(len(v[1]) for v in d.values()))
"""


SQL_SCRIPT = """create table t(a integer primary key, b text, c text);
with recursive n(i) as (select 1 union all select i + 1 from n where i < {rows})
  insert into t select i, hex(randomblob(16)), printf('%d-%d', i, i * 7) from n;
create index tb on t(b);
select count(*), sum(length(c)) from t where b > '8';
"""


def program_runs(build, m):
    """[(name, command)]: the real programs installed, on inputs written to
    BUILD/bench/programs (their sizes from the mode)."""
    d = os.path.join(build, "bench", "programs")
    os.makedirs(d, exist_ok=True)
    out = []
    # Debian's interpreter, not a version manager's shim (a shell script)
    py = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else shutil.which("python3")
    if py:
        with open(os.path.join(d, "dicts.py"), "w") as f:
            f.write(PY_SCRIPT)
        # PYTHONMALLOC=malloc: every object through malloc, not pymalloc's arenas
        out.append(("python3", ["env", "PYTHONMALLOC=malloc", py, os.path.join(d, "dicts.py"),
                                m["prog_py"]]))
    if shutil.which("sqlite3"):
        with open(os.path.join(d, "rows.sql"), "w") as f:
            f.write(SQL_SCRIPT.format(rows=m["prog_sql"]))
        out.append(("sqlite3", ["sqlite3", ":memory:", "-init", os.path.join(d, "rows.sql"),
                                ".quit"]))
    if shutil.which("gcc"):
        src = os.path.join(d, "unit.c")
        with open(src, "w") as f:
            for i in range(m["prog_cc"]):
                f.write(f"int f{i}(int x) {{ int a[8]; for (int j = 0; j < 8; j++) "
                        f"a[j] = x * {i} + j; return a[x & 7] + {i * 7 % 1000}; }}\n")
        out.append(("gcc", ["gcc", "-O2", "-c", src, "-o", os.path.join(d, "unit.o")]))
    return out


# Each benchmark: the program it runs and its timeout (s), its
# configurations from the mode's parameters m ([(label, config, ctx)]: the
# config goes into each row, ctx to args), who runs it ("allocs": the
# allocators but the guarded ones; "guarded": those and qmalloc; "methods":
# seed_loop's methods), which of them ("runs", all if absent) and with which
# arguments ("args"). In the report's order; every round runs a config's
# runs in turn (A B C A B C ...).


def _large(w, t, touch):
    return f"W={w} T={t} {touch}", {"window": w, "threads": t, "touch": touch}, (w, t, touch)


def _large_args(a, m, c):
    w, t, touch = c
    if a.name.startswith("qmalloc"):
        return ["--window", w, "--threads", t, "--touch", touch, "--ops", m["qm_ops"],
                "--max-ms", 600000, "--warm", w + m["qm_warm"], "--warm-ms", 600000]
    return ["--window", w, "--threads", t, "--touch", touch, "--ops", m["large_ops"],
            "--max-ms", m["large_ms"], "--warm", w + m["large_warm"],
            "--warm-ms", m["large_warm_ms"]]


def _record_args(a, m, c):
    w, t, touch = c
    ops, warm = m["record_ops"], m["record_warm"]
    if a.name.startswith("qmalloc"):
        warm = max(warm, m["qm_warm"])
    if a.name == "efence":
        ops, warm = min(ops, EFENCE_RECORD_OPS), min(warm, EFENCE_RECORD_WARM)
    return ["--window", w, "--threads", t, "--touch", touch, "--ops", ops, "--warm", w + warm,
            "--max-ms", 600000, "--record", 1]


def _cold(m):
    (w, t, touch) = m["record_configs"][0]
    return [(f"W={w} T={t} {touch}, first {m['cold_ops']} ops",
             {"window": w, "threads": t, "touch": touch}, (w, t, touch))]


def _threads(ts):
    return [(f"T={t}", {"threads": t}, t) for t in ts]


def _but(*names):
    return lambda a, m, c: a.name not in names


_SEED_TOUCH_LABEL = {"all": "every page", "0": "no page", "1": "one page"}
_REALLOC_LABEL = {"double": "x2 from 1 KiB to 64 MiB", "step": "+4 KiB from 4 KiB to 8 MiB"}
# small churn's blocks passed between threads (small_churn --mode): the
# qmalloc variants that change only large chunks are left out
_PASSING = _but("efence", "qmalloc-noquar", "qmalloc-nostacks")
_PHASES = ["--mode", "phases", "--phases", 8]

WORKLOADS = [
    {"bench": "seed_loop", "prog": "seed_loop", "timeout": 120, "who": "methods",
     "configs": lambda m, build: [(f"{s} KiB, " + _SEED_TOUCH_LABEL[t], {"size_kb": s, "touch": t},
                                   (s, t)) for s in m["seed_sizes"] for t in SEED_TOUCH],
     "runs": lambda meth, m, c: meth != "mprotect-thp" or c[0] >= 2048,  # THP needs 2 MiB
     "args": lambda meth, m, c: ["--method", meth, "--size-kb", c[0], "--touch", c[1],
                                 "--max-ms", m["seed_ms"]]},
    {"bench": "large_churn", "prog": "large_churn", "timeout": 300,
     "configs": lambda m, build: [_large(*x) for x in m["large_configs"]],
     "runs": lambda a, m, c: a.name != "efence" or c in m["efence_configs"],
     "args": _large_args},
    {"bench": "small_churn", "prog": "small_churn", "timeout": 120,
     "configs": lambda m, build: _threads((1, 2)), "runs": _but("efence"),
     "args": lambda a, m, t: ["--threads", t, "--ops", m["small_ops"], "--max-ms", m["small_ms"]]},
    {"bench": "small_churn", "prog": "small_churn", "timeout": 300, "who": "guarded",
     "configs": lambda m, build: [("T=1 guarded", {"threads": 1, "guarded": 1}, 1)],
     "args": lambda a, m, t: ["--threads", t, "--ops", m["small_ops"], "--max-ms",
                              m["guarded_ms"], "--warm", m["guarded_warm"]]},
    {"bench": "producer_consumer", "prog": "small_churn", "timeout": 120,
     "configs": lambda m, build: [("pairs=1", {"pairs": 1}, 1)], "runs": _PASSING,
     "args": lambda a, m, p: ["--mode", "pc", "--pairs", p, "--ops", m["small_ops"],
                              "--max-ms", m["small_ms"]]},
    {"bench": "handoff", "prog": "small_churn", "timeout": 120,
     "configs": lambda m, build: _threads((1, 2)), "runs": _PASSING,
     "args": lambda a, m, t: ["--mode", "handoff", "--threads", t, "--warm-gens",
                              m["handoff_warm_gens"], "--ops", m["small_ops"],
                              "--max-ms", m["small_ms"]]},
    {"bench": "phases", "prog": "small_churn", "timeout": 120,
     "configs": lambda m, build: [("phases=8", {"phases": 8}, None)], "runs": _PASSING,
     "args": lambda a, m, c: _PHASES + ["--phase-ops", m["phase_ops"]]},
    # the same with 2 blocks in 1,000 made 2,048 times larger (16 KiB..2 MiB):
    # large chunks too, so the quarantine's share of the peak is shown beside
    {"bench": "phases", "prog": "small_churn", "timeout": 120,
     "configs": lambda m, build: [("phases=8 mixed", {"phases": 8, "big_pm": 2, "big_mul": 2048},
                                   None)],
     "runs": _but("efence", "qmalloc-nostacks"),
     "args": lambda a, m, c: _PHASES + ["--phase-ops", m["phase_ops"], "--big-pm", 2,
                                        "--big-mul", 2048]},
    {"bench": "realloc_growth", "prog": "realloc_growth", "timeout": 300,
     "configs": lambda m, build: [(_REALLOC_LABEL[x], {"mode": x}, x) for x in ("double", "step")],
     "runs": _but("efence"),
     "args": lambda a, m, x: ["--mode", x, "--reps", m["realloc_reps"], "--max-ms",
                              m["realloc_ms"], "--cap-ms", m["realloc_cap_ms"]]},
    {"bench": "large_record", "prog": "large_churn", "timeout": 300,
     "configs": lambda m, build: [_large(*x) for x in m["record_configs"]],
     "runs": lambda a, m, c: a.name != "efence" or c in m["efence_configs"],
     "args": _record_args},
    {"bench": "cold_start", "prog": "large_churn", "timeout": 300,
     "configs": lambda m, build: _cold(m),
     "args": lambda a, m, c: ["--window", c[0], "--threads", c[1], "--touch", c[2], "--ops",
                              m["cold_ops"], "--warm", 0, "--max-ms", 600000]},
    {"bench": "small_record", "prog": "small_churn", "timeout": 300,
     "configs": lambda m, build: _threads(m["small_record_threads"]), "runs": _but("efence"),
     "args": lambda a, m, t: ["--threads", t, "--ops", m["small_record_ops"], "--max-ms", 600000,
                              "--record", 1]},
    {"bench": "programs", "prog": "program_time", "timeout": 300,
     "configs": lambda m, build: [(name, {"program": name}, (name, cmd))
                                  for name, cmd in program_runs(build, m)],
     "runs": lambda a, m, c: a.name != "efence" and not a.linked,
     "args": lambda a, m, cmd: ["--name", cmd[0], "--"] + cmd[1]},
]


def bench_plan(mode, allocs, build):
    """(bench, config label, config dict, [(alloc or method, prog, args, timeout)])"""
    m = MODES[mode]
    who = {"allocs": [a for a in allocs if not a.guarded],
           "guarded": [a for a in allocs if a.guarded or a.name == "qmalloc"],
           "methods": SEED_METHODS}
    plan = []
    for wl in WORKLOADS:
        runs_it = wl.get("runs", lambda a, m, c: True)
        for label, cfg, ctx in wl["configs"](m, build):
            runs = [(a, wl["prog"], wl["args"](a, m, ctx), wl["timeout"])
                    for a in who[wl.get("who", "allocs")] if runs_it(a, m, ctx)]
            plan.append((wl["bench"], label, cfg, runs))
    return plan


def command_line(prog, args, alloc):
    """What ran, as a shell line from the build directory (the report's "how
    the run was made")."""
    env = ""
    if alloc:
        env = " ".join(f"{k}={v}" for k, v in alloc.env.items())
        if alloc.preload:
            env = (env + " " if env else "") + "LD_PRELOAD=" + (
                "src/libqmalloc.so" if alloc.name.startswith("qmalloc") and not alloc.by_path
                and alloc.name != "qmalloc-base" else alloc.preload)
    exe = "bench/" + prog + ("_je" if alloc and alloc.linked else "")
    return " ".join(x for x in [env, exe] + [str(a) for a in args] if x)


def rounds_of(mode, bench):
    """Record and cold-start runs have their own number of rounds."""
    m = MODES[mode]
    key = {"large_record": "record_rounds", "small_record": "record_rounds",
           "cold_start": "cold_rounds"}.get(bench, "rounds")
    return m[key]


# ---- planted bugs -----------------------------------------------------------

# bench/planted.c's bugs, with what the report calls them
BUGS = [("double-free", "double free"), ("invalid-free", "interior free"),
        ("uaf-write-small", "write after free, 64 B"),
        ("uaf-write-large", "write after free, 1 MiB"),
        ("overflow-small", "1 byte past 24 B"), ("overflow-large", "1 byte past 256 KiB")]


CAUGHT = ("at once", "later", "at exit")
