"""report.md written from the rows of a run (and results.csv, run.json),
and those rows read back for --report-only and --cost."""

import csv
import json
import os

from .common import fmt, median, spread
from .workloads import MODES, REFERENCE
from .aggregate import (
    configs_of, fail_cell, med, mib, names_of, num, ran, ratio_cell, ratios, table, values)
from .charts import chart
from .summary import SUMMARY_MD, summary_section
from .sections import (
    cost_section, detection_section, how_section, passing_section, record_sections,
    small_latency_section, targets)


def write_report(build, mode, rows, failures, allocs, notes, meta, info, cost, save_rows=True):
    """report.md: the summary table and plot, how the run was made, each
    benchmark's section, the cost check, the project's own targets last."""
    outdir = os.path.join(build, "bench")
    os.makedirs(outdir, exist_ok=True)
    md = [f"# qmalloc against other allocators ({mode} mode)" if rows
          else "# qmalloc against other allocators: instructions per op", ""]
    summary, (plot, why) = summary_section(rows, cost, outdir)
    SUMMARY_MD[:] = summary
    if summary and rows:
        md += ["qmalloc's two profiles (the default, and `hardening=max` with every check on) "
               "against every other allocator measured, on the same programs in the same "
               "rounds. Times are medians over the rounds on a shared machine; faults, RSS, "
               "detection and instruction counts do not depend on its load. Each column's "
               "benchmark is described in its section below.", ""]
    elif summary:
        md += ["Instructions per op of small churn under cachegrind, qmalloc against the "
               "other allocators (section 7); `./qmalloc bench` adds times, faults, peak RSS "
               "and planted bugs to this table.", ""]
        md += summary + [""]
        md += [f"![qmalloc against other allocators]({plot})" if plot
               else f"(No plot: {why}.)", ""]
    md += how_section(build, mode, rows, meta, allocs, notes, info, cost)
    charts = {}

    # seed loop
    b = "seed_loop"
    if configs_of(rows, b):
        md += ["## 1. The seed loop: retire + revive a mapped range, then write it", "",
               "One range mapped and written once; each iteration retires and revives it and "
               "then writes every page, no page, or one page. `write`: no retire/revive "
               "(the floor); `mprotect`: the seed's mprotect(NONE) + mprotect(RW) pair; "
               "`mprotect-thp`: the same pair on a 2 MiB-aligned MADV_HUGEPAGE range (8 MiB "
               "only: transparent huge pages need 2 MiB); `dontneed`: MADV_DONTNEED; `qm-*`: "
               "qmalloc's strategies through qm_strategy_cost() (their ranges sit between guard "
               "pages, as qmalloc's chunks do). Faults per iteration first; ns per iteration as "
               "median [min..max] of the rounds' medians; ratio to the seed's `mprotect` pair, "
               "paired by round.", ""]
        trs = []
        for c in configs_of(rows, b):
            for n in ran(rows, b, c):
                f = med(rows, b, c, n, "faults_per_iter")
                if f is None:
                    trs.append([c, n, fail_cell(failures, b, c, n), "-", "-"])
                    continue
                trs.append([c, n, fmt(f), spread(values(rows, b, c, n, "ns_per_iter")),
                            ratio_cell(rows, b, c, n, "mprotect", "ns_per_iter")])
        md += table(["size, touch", "method", "faults/iter", "ns/iter", "x mprotect pair"], trs)
        cf = configs_of(rows, b)
        nm = names_of(rows, b)
        charts[b] = chart(os.path.join(outdir, "seed_loop.svg"), "Seed loop: per iteration",
                          cf, nm,
                          [("ns per iteration", True,
                            {(c, n): med(rows, b, c, n, "ns_per_iter") for c in cf for n in nm}),
                           ("faults per iteration", True,
                            {(c, n): med(rows, b, c, n, "faults_per_iter")
                             for c in cf for n in nm})])
        md += ["", "Chart: zero faults draw no bar (log scale)."]
        md += ["", "![seed loop](seed_loop.svg)", ""]

    # large churn
    b = "large_churn"
    if configs_of(rows, b):
        md += ["## 2. Large churn through malloc/free", "",
               "Sizes log-uniform over 128 KiB..4 MiB (fixed seed), a FIFO window of W live "
               "blocks per thread, T threads, each new block touched one byte per page (`page`) "
               f"or written whole (`full`). An untimed warm-up first (W+{MODES[mode]['large_warm']} "
               f"ops per thread or {MODES[mode]['large_warm_ms']} ms, whichever ends first, so "
               "that caches reach their steady state), then "
               f"{MODES[mode]['large_ms']} ms timed; the qmalloc builds W+{MODES[mode]['qm_warm']} "
               f"ops then {MODES[mode]['qm_ops']} timed, counted in ops whatever they take "
               "(their quarantine window fills only after 32 MiB of frees, and a short timed "
               "phase on a slow machine holds too few ops for faults/op). "
               "One op = one malloc + one free. Peak RSS = VmHWM; RSS after = VmRSS once "
               "everything is freed; maps = lines of /proc/self/maps at peak.", ""]
        trs = []
        for c in configs_of(rows, b):
            for n in ran(rows, b, c):
                f = med(rows, b, c, n, "faults_per_op")
                if f is None:
                    trs.append([c, n, fail_cell(failures, b, c, n), "-", "-", "-", "-", "-"])
                    continue
                trs.append([c, n, fmt(f), spread(values(rows, b, c, n, "ops_per_s")),
                            ratio_cell(rows, b, c, n, REFERENCE, "ops_per_s"),
                            fmt(mib(med(rows, b, c, n, "peak_rss_kb"))),
                            fmt(mib(med(rows, b, c, n, "rss_after_kb"))),
                            fmt(med(rows, b, c, n, "maps_peak"))])
        md += table(["config", "allocator", "faults/op", "ops/s", "x jemalloc ops/s",
                     "peak RSS MiB", "RSS after free MiB", "maps at peak"], trs)
        qrows = []
        for c in configs_of(rows, b):
            for n in ("qmalloc", "qmalloc-noquar"):
                ops = med(rows, b, c, n, "ops")
                if not ops:
                    continue
                per = lambda k: fmt((med(rows, b, c, n, k) or 0) / ops)  # noqa: E731
                qrows.append([c, n, per("qm_mprotect"), per("qm_mmap"), per("qm_munmap"),
                              per("qm_madvise"), per("qm_reuses"), per("qm_fresh"),
                              per("qm_drops"), per("qm_avoided")])
        if qrows:
            md += ["", "qmalloc's own counters (qm_stats) per op, timed phase, medians:", ""]
            md += table(["config", "allocator", "mprotect", "mmap", "munmap", "madvise",
                         "reuses", "fresh maps", "drops", "faults avoided"], qrows)
        cf, nm = configs_of(rows, b), names_of(rows, b)
        charts[b] = chart(os.path.join(outdir, "large_churn.svg"), "Large churn", cf, nm,
                          [("ops/s", True, {(c, n): med(rows, b, c, n, "ops_per_s")
                                            for c in cf for n in nm}),
                           ("faults per op", True, {(c, n): med(rows, b, c, n, "faults_per_op")
                                                    for c in cf for n in nm})])
        md += ["", "![large churn](large_churn.svg)", ""]

    md += record_sections(rows, failures, mode)

    # small churn
    b = "small_churn"
    if configs_of(rows, b):
        md += ["## 3. Small churn", "",
               "Sizes uniform over 8..1024 bytes, 10,000 live blocks per thread, each op frees a "
               "random one and allocates a new one (writing its first and last byte); 200,000 "
               f"untimed ops per thread first, then {MODES[mode]['small_ms']} ms timed. "
               f"T=1 guarded: the allocators that guard every allocation, "
               f"{MODES[mode]['guarded_warm']:,} untimed ops, then "
               f"{MODES[mode]['guarded_ms']} ms timed (at about 1,000 ops/s Electric Fence and "
               "DUMA would need minutes for the others' warm-up). Maps: lines of "
               "/proc/self/maps at the end of the timed phase.", ""]
        trs = []
        for c in configs_of(rows, b):
            for n in ran(rows, b, c):
                f = med(rows, b, c, n, "faults_per_op")
                if f is None:
                    trs.append([c, n, fail_cell(failures, b, c, n), "-", "-", "-", "-", "-"])
                    continue
                trs.append([c, n, fmt(f, 2), spread(values(rows, b, c, n, "ops_per_s")),
                            ratio_cell(rows, b, c, n, REFERENCE, "ops_per_s"),
                            fmt(mib(med(rows, b, c, n, "peak_rss_kb"))),
                            fmt(mib(med(rows, b, c, n, "rss_after_kb"))),
                            fmt(med(rows, b, c, n, "maps_peak"))])
        md += table(["config", "allocator", "faults/op", "ops/s", "x jemalloc ops/s",
                     "peak RSS MiB", "RSS after free MiB", "maps"], trs)
        cf, nm = configs_of(rows, b), names_of(rows, b)
        charts[b] = chart(os.path.join(outdir, "small_churn.svg"), "Small churn", cf, nm,
                          [("ops/s", True, {(c, n): med(rows, b, c, n, "ops_per_s")
                                            for c in cf for n in nm}),
                           ("faults per op", False, {(c, n): med(rows, b, c, n, "faults_per_op")
                                                     for c in cf for n in nm})])
        md += ["", "![small churn](small_churn.svg)", ""]
    md += small_latency_section(rows, failures, mode)
    md += passing_section(rows, failures, mode, outdir, charts)

    # realloc growth
    b = "realloc_growth"
    if configs_of(rows, b):
        md += ["## 4. realloc growth", "",
               "A buffer grown by realloc, the new bytes written after each step, then freed; "
               "one untimed warm-up sequence, then repeated. Per sequence: faults, time (median "
               "of the run, then [min..max] over rounds), moves (realloc returned a new "
               "address).", ""]
        trs = []
        for c in configs_of(rows, b):
            for n in ran(rows, b, c):
                f = med(rows, b, c, n, "faults_per_seq")
                if f is None:
                    trs.append([c, n, fail_cell(failures, b, c, n), "-", "-", "-", "-"])
                    continue
                ms = [v / 1e6 for v in values(rows, b, c, n, "ns_per_seq")]
                if any(values(rows, b, c, n, "capped")):
                    reached = mib(med(rows, b, c, n, "reached_kb"))
                    trs.append([c, n, f"{fmt(f)} (for {fmt(reached)} MiB)",
                                f"stopped at {fmt(reached)} MiB after {spread(ms)}",
                                "-", "-", f"{fmt(med(rows, b, c, n, 'moves_per_seq'))} "
                                f"(for {fmt(reached)} MiB)"])
                    continue
                trs.append([c, n, fmt(f), spread(ms), ratio_cell(rows, b, c, n, REFERENCE,
                                                                 "ns_per_seq"),
                            ratio_cell(rows, b, c, n, "glibc", "ns_per_seq"),
                            fmt(med(rows, b, c, n, "moves_per_seq"))])
        md += table(["growth", "allocator", "faults/seq", "ms/seq", "x jemalloc time",
                     "x glibc time", "moves/seq"], trs)
        cf, nm = configs_of(rows, b), names_of(rows, b)
        charts[b] = chart(os.path.join(outdir, "realloc_growth.svg"), "realloc growth", cf, nm,
                          [("sequences/s", True,
                            {(c, n): (1e9 / med(rows, b, c, n, "ns_per_seq")
                                      if med(rows, b, c, n, "ns_per_seq")
                                      and not any(values(rows, b, c, n, "capped")) else None)
                             for c in cf for n in nm}),
                           ("faults per sequence", True,
                            {(c, n): med(rows, b, c, n, "faults_per_seq")
                             for c in cf for n in nm})])
        md += ["", "![realloc growth](realloc_growth.svg)", ""]

    # real programs
    b = "programs"
    if configs_of(rows, b):
        m = MODES[mode]
        md += ["## 5. Real programs", "",
               "Each program run whole under each allocator (preloaded, inherited by every "
               "process it starts), stdout discarded, pinned to one CPU: `python3` "
               f"(PYTHONMALLOC=malloc, so every object goes through malloc) doing {m['prog_py']:,} "
               f"dict inserts and deletes of small lists and strings; `sqlite3` (in memory) "
               f"inserting {m['prog_sql']:,} rows, indexing and querying them; `gcc -O2 -c` of "
               f"{m['prog_cc']:,} small functions. Wall time in ms (median [min..max] of the "
               "rounds), its ratio to jemalloc's and glibc's paired by round, minor faults and "
               "peak RSS of the largest process. Small churn is the worst case for an allocator "
               "that checks what it frees: it frees blocks it has not touched for about 10,000 "
               "ops, so every check is a cache miss. These programs show what the checks cost "
               "a whole program. Start-up is included (a few ms; it dominates smoke runs).", ""]
        trs = []
        for c in configs_of(rows, b):
            for n in ran(rows, b, c):
                t = med(rows, b, c, n, "ms")
                if t is None:
                    trs.append([c, n, fail_cell(failures, b, c, n), "-", "-", "-", "-"])
                    continue
                trs.append([c, n, spread(values(rows, b, c, n, "ms")),
                            ratio_cell(rows, b, c, n, REFERENCE, "ms"),
                            ratio_cell(rows, b, c, n, "glibc", "ms"),
                            num(med(rows, b, c, n, "minflt")),
                            fmt(mib(med(rows, b, c, n, "peak_rss_kb")))])
        md += table(["program", "allocator", "ms", "x jemalloc time", "x glibc time",
                     "minor faults", "peak RSS MiB"], trs)
        cf, nm = configs_of(rows, b), names_of(rows, b)
        charts[b] = chart(os.path.join(outdir, "programs.svg"), "Real programs", cf, nm,
                          [("x jemalloc time", False,
                            {(c, n): median(ratios(rows, b, c, n, REFERENCE, "ms")) or None
                             for c in cf for n in nm})])
        md += ["", "![real programs](programs.svg)", ""]

    md += detection_section(rows)
    md += cost_section(build, cost)
    if rows:
        goals = targets(rows, failures, [a.name for a in allocs if a.by_path],
                        [a.name for a in allocs
                         if "hardening=max" in a.env.get("QMALLOC_OPTIONS", "").split(":")])
        met = sum("**met**" in t for t in goals)
        missed = sum("**MISSED**" in t for t in goals)
        md += ["## The project's own targets", "",
               "Goals qmalloc set itself in its issues (ratios to jemalloc, fault and RSS "
               f"limits), not a comparison: {met} met, {missed} missed in this run ({mode} "
               f"mode{'' if mode == 'full' else ': its short phases make the close ones flip'})."]
        md += goals[1:]
        md += ["", f"Raw rows: `results.csv` ({len(rows)} runs). Charts: "
               + ", ".join(f"`{k}.svg` ({v})" for k, v in charts.items())
               + (", `summary.png`" if plot else "") + "."]
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    if save_rows:
        keys = []
        for r in rows:
            keys += [k for k in r if k not in keys]
        with open(os.path.join(outdir, "results.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        with open(os.path.join(outdir, "run.json"), "w") as f:
            json.dump(meta, f, indent=1)
    return os.path.join(outdir, "report.md")


def load_rows(build):
    """The rows of an earlier run, from results.csv."""
    rows, failures, elapsed = [], {}, 0.0
    with open(os.path.join(build, "bench", "results.csv")) as f:
        for r in csv.DictReader(f):
            row = {}
            for k, v in r.items():
                if v in ("", None):
                    continue
                try:
                    row[k] = float(v)
                except ValueError:
                    row[k] = v
            row["round"], row["ok"] = int(row["round"]), int(row["ok"])
            if not row["ok"]:
                failures.setdefault((row["bench"], row["config"], row["alloc"]), row.get("error"))
            elapsed += row.get("wall_s", 0.0)
            rows.append(row)
    mode = rows[0].get("mode", "quick") if rows else "quick"
    return rows, failures, elapsed, mode if mode in MODES else "quick"
