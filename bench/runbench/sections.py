"""The report's sections past the summary: how the run was made, detection,
the cost check, record runs, blocks passed between threads, latency, and
the project's own targets."""

import os
import re

from .common import ROOT, fmt, median, package_of, sh, spread
from .workloads import BUGS, CAUGHT, EFENCE_RECORD_OPS, EFENCE_RECORD_WARM, MODES, REFERENCE
from .runners import PIN_CPUS, cost_module, file_sha
from .aggregate import (
    LAT_KEYS, configs_of, fail_cell, machine_lines, med, mib, names_of, num, option_default,
    quarantine_budget_mb, ran, ratio_cell, ratios, table, triple, values)
from .charts import chart


def how_section(build, mode, rows, meta, allocs, notes, info, cost):
    """How the run was made: when, where, what ran."""
    rounds = max((r["round"] for r in rows), default=MODES[mode]["rounds"])
    md = ["## How the run was made", ""]
    argv = meta.get("argv")
    if rows:
        md.append(f"- Run: {meta.get('started', '?')}, {mode} mode, {rounds} "
                  f"round{'s' if rounds != 1 else ''} interleaved "
                  f"across allocators (A B C A B C ...), {meta.get('elapsed', 0) / 60:.1f} min; "
                  "each figure is the median of its rounds, each ratio paired round by round")
    if argv is not None:
        md.append("- Command: `./qmalloc bench" + "".join(" " + a for a in argv) + "` (that is, "
                  "`bench/run-bench --build BUILD` with the same arguments)")
    if cost:
        md.append(f"- Instructions per op: `./qmalloc bench --cost`, "
                  f"{next(iter(cost.values())).get('date', '?')} (section 7)")
    md += machine_lines()
    if len(PIN_CPUS) > 1 and rows:
        md.append(f"- One-thread runs pinned to CPU {PIN_CPUS[-1]} (all allocators the same)")
    if meta.get("load0"):
        md.append(f"- Load average at start {' '.join(meta['load0'])}, at end "
                  f"{' '.join(meta.get('load1', []))} (other work on the machine inflates "
                  "times, not fault or instruction counts)")
    head = meta.get("tree") or sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    md.append(f"- qmalloc: {build}/src/libqmalloc.so, tree {head or '?'}"
              f"{' with uncommitted changes in src/ or include/' if meta.get('dirty') else ''}")
    if info:
        md.append(f"- Probe verdict: fast path for dirty pages {info.get('fast_dirty', '?')}, "
                  f"clean pages {info.get('fast_clean', '?')}, guard regions "
                  f"{info.get('guard_regions', '?')} ({info.get('faults_dirty', '?')} faults "
                  f"rewriting {info.get('pages', '?')} pages after NONE -> RW; probe took "
                  f"{float(info.get('probe_ns', 0)) / 1e6:.1f} ms)")
        md.append(f"- Chosen strategy: **{info.get('strategy', '?')}**: {info.get('reason', '')}")
    md += ["", "Allocators:", ""]
    for a in allocs:
        pkg = (package_of(a.preload) if a.preload and not a.by_path
               and not a.name.startswith("qmalloc") else "")
        md.append(f"- `{a.name}`: {a.desc}{' (' + pkg + ')' if pkg else ''}")
    md += note_lines(notes, allocs)
    cmds = {}
    for r in rows:
        if not r.get("cmd"):
            continue
        b, c = r["bench"], r["config"]
        cmd = re.sub(r"^(\S+=\S+ )+", "", r["cmd"])  # without the allocator's environment
        cmd = re.sub(r"^(bench/\w+?)_je\b", r"\1", cmd)  # jemalloc-linked's copy of the program
        if b == "seed_loop":  # one line for the section's grid
            c = "each size, touch and method"
            for opt, what in (("method", "METHOD"), ("size-kb", "KIB"), ("touch", "all/0/1")):
                cmd = re.sub(rf"--{opt} \S+", f"--{opt} {what}", cmd)
        elif b == "detection":
            c, cmd = "each bug", re.sub(r"--bug \S+", "--bug BUG", cmd)
        cmds.setdefault((b, c), {}).setdefault(cmd, set()).add(r["alloc"])
    if cmds:
        md += ["", "Programs run, from the build directory, under each allocator as listed "
               "above (`LD_PRELOAD=` its library, its options in the environment; "
               "`jemalloc-linked` runs the `_je` copy of each; `results.csv` has each run's "
               "whole line):", ""]
        trs = []
        for (b, c), d in cmds.items():
            cell = []
            for cmd, who in d.items():
                mark = (" (the qmalloc builds)" if len(d) > 1
                        and all(n.startswith("qmalloc") for n in who) else "")
                cell.append(f"`{cmd}`{mark}")
            trs.append([b, c, "<br>".join(cell)])
        md += table(["benchmark", "config", "command"], trs)
    md.append("")
    return md


def detection_section(rows):
    det = [r for r in rows if r["bench"] == "detection"]
    if not det:
        return []
    names = []
    for r in det:
        if r["alloc"] not in names:
            names.append(r["alloc"])
    md = ["## 6. Planted bugs", "",
          "`bench/planted --bug NAME` plants one bug and then goes on allocating and freeing "
          "blocks of the same size (2,000 of them), as a program would, so that a check made "
          "later gets its chance. Each cell: how the process ended and when: **at once** (at "
          "the faulty access or call), **later** (after it returned), **at exit**; `missed`: "
          "it ran to its end; `warned`: it ran to its end but the allocator printed something. "
          "The allocator's first line is under the table.", ""]
    cells, said = [], {}
    for n in names:
        line = [f"**{n}**" if n.startswith("qmalloc") else n]
        for bug, _ in BUGS:
            r = next((x for x in det if x["alloc"] == n and x["config"] == bug), None)
            if r is None:
                line.append("-")
            elif not r.get("ok"):
                line.append("failed: " + str(r.get("error", "?"))[:80])
            elif r["outcome"] in CAUGHT:
                line.append(f"{r['how']} {r['outcome']}")
            else:
                line.append(r["outcome"])
            if r and r.get("ok") and r.get("message"):
                # the same words with other addresses are the same message
                msg = re.sub(r"\b(0x)?[0-9a-f]{8,}\b", "ADDR", str(r["message"]))
                said.setdefault((bug, msg), []).append(n)
        cells.append(line)
    md += table(["allocator"] + [f"{b[1]} (`{b[0]}`)" for b in BUGS], cells)
    if said:
        md += ["", "What each said first (stderr):", ""]
        md += [f"- {bug}, {', '.join(ns)}: `{msg.replace('`', chr(39))}`"
               for (bug, msg), ns in said.items()]
    md.append("")
    return md


def cost_section(build, cost):
    if not cost:
        return []
    any_row = next(iter(cost.values()))
    md = ["## 7. Instructions per op (cachegrind)", "",
          f"Small churn (one thread, 10,000 live blocks of 8..1024 bytes, seed 42) under "
          f"`valgrind --tool=cachegrind {any_row.get('geometry', '')}`: a fixed simulated "
          "cache, so the counts do not depend on the machine or its load. Two runs per "
          f"allocator, {int(float(any_row.get('ops') or 0)) + 1:,} ops and 1 op after "
          f"{int(float(any_row.get('warm') or 0)):,} untimed ones; their difference over "
          f"{int(float(any_row.get('ops') or 0)):,} is one op in steady state (start-up, the "
          "fill and the teardown cancel out). **Allocator instructions**: every instruction "
          "outside the benchmark's own functions (its malloc and free calls, whatever the "
          "allocator calls in libc included); **program**: all of them. D1 misses: data reads "
          "and writes; LL misses: cachegrind's total (data and instructions). Method: "
          "`bench/cost-check`. Measured "
          f"{any_row.get('date', '?')}, tree {any_row.get('tree', '?')}.", ""]
    sha = file_sha(os.path.join(build, "src", "libqmalloc.so"))
    if any_row.get("lib_sha256") and sha and any_row["lib_sha256"] != sha:
        md += ["**These counts are of another build of libqmalloc.so than the one in "
               f"{build}/src now: rerun `./qmalloc bench --cost`.**", ""]
    ref = cost.get("qmalloc")
    trs = []
    for n, r in cost.items():
        if not r["ok"]:
            trs.append([n, "failed: " + r.get("error", "?"), "-", "-", "-", "-"])
            continue
        x = (f"{r['alloc_ir'] / ref['alloc_ir']:.2f}" if ref and ref["ok"] and ref["alloc_ir"]
             else "-")
        trs.append([f"**{n}**" if n.startswith("qmalloc") else n, f"{r['alloc_ir']:,.1f}", x,
                    f"{r['total_ir']:,.1f}", f"{r['d1']:.2f}", f"{r['ll']:.2f}"])
    md += table(["allocator", "allocator instr/op", "x qmalloc", "program instr/op",
                 "D1 misses/op", "LL misses/op"], trs)
    budget = os.path.join(ROOT, "bench", "cost-budget.txt")
    if os.path.exists(budget) and ref and ref["ok"]:
        cc = cost_module()
        b = cc.read_budget(budget)
        val, tol = float(b["alloc_instr_per_op"]), float(b.get("tolerance_pct", 5))
        md += ["", f"Budget (`bench/cost-budget.txt`, test `cost-budget` of suite `cost`): "
               f"{val:g} allocator instructions per op for qmalloc's default profile, at most "
               f"+{tol:g}%; measured {ref['alloc_ir']:.1f} "
               f"({(ref['alloc_ir'] / val - 1) * 100:+.1f}%). A change that lowers the count "
               "lowers the budget: `./qmalloc bench --cost --update-budget`."]
    md.append("")
    return md


def note_lines(notes, allocs):
    """The notes, each once: allocators that share a note (efence-pf and duma
    run in the same one config) are named together before it."""
    by_text = {}
    for a in allocs:
        if a.note:
            by_text.setdefault(a.note, []).append(a.name)
    out = [f"- Note: {n}" for n in dict.fromkeys(notes)]
    out += [f"- Note on {', '.join(names)}: {text}" for text, names in by_text.items()]
    return out


def record_sections(rows, failures, mode):
    """Reuse distance and per-call latency of large churn; its cold start."""
    m = MODES[mode]
    md = []
    b = "large_record"
    if configs_of(rows, b):
        md += ["## 2b. Large churn: reuse distance and the latency of one call", "",
               "Separate runs of large churn with every call of the timed phase timed and "
               f"logged ({m['record_ops']} ops per thread after a warm-up of W+"
               f"{m['record_warm']}, the qmalloc builds W+{max(m['record_warm'], m['qm_warm'])}; "
               f"Electric Fence {EFENCE_RECORD_OPS} after "
               f"W+{EFENCE_RECORD_WARM}; {m['record_rounds']} round(s), medians). **Reuse "
               "distance**: for each block freed in the log whose address range some later "
               "malloc handed out again, in whole or in part, how many large frees and how many "
               "MiB of large frees came between its free and that malloc, taken from the "
               "addresses the benchmark sees: the window in which a dangling pointer to it "
               "still hits freed (for qmalloc: inaccessible) memory. `open`: freed blocks whose "
               "range had not come back when the log ended. Faults/op from the main runs "
               "(section 2) beside it. **Latency**: one malloc, one free, in microseconds; the "
               "clock's own floor is the last column.", ""]
        trs = []
        for c in configs_of(rows, b):
            for n in ran(rows, b, c):
                if med(rows, b, c, n, "reuse_n") is None:
                    trs.append([c, n, fail_cell(failures, b, c, n)] + ["-"] * 6)
                    continue
                trs.append([c, n, fmt(med(rows, "large_churn", c, n, "faults_per_op")),
                            f"{num(med(rows, b, c, n, 'reuse_n'))} "
                            f"({num(med(rows, b, c, n, 'reuse_open'))})",
                            triple(rows, b, c, n, ["reuse_frees_min", "reuse_frees_p1",
                                                   "reuse_frees_p50"]),
                            triple(rows, b, c, n, ["reuse_mib_min", "reuse_mib_p1",
                                                   "reuse_mib_p50"]),
                            triple(rows, b, c, n, LAT_KEYS["malloc"], 1000.0),
                            triple(rows, b, c, n, LAT_KEYS["free"], 1000.0),
                            num(med(rows, b, c, n, "clock_floor_ns"))])
        md += table(["config", "allocator", "faults/op", "reused (open)",
                     "frees after: min / p1 / p50", "MiB after: min / p1 / p50",
                     "malloc us: p50 / p99 / p99.9", "free us: p50 / p99 / p99.9",
                     "clock ns"], trs)
        md.append("")
    b = "cold_start"
    if configs_of(rows, b):
        md += ["## 2c. Large churn: cold start", "",
               f"The first {m['cold_ops']} ops of large churn in a fresh process, no warm-up "
               "(the allocator's start-up included: qmalloc's probe runs at its first large "
               "allocation): what a program that makes only a few hundred large allocations "
               "pays, here before any quarantine has filled. "
               f"{m['cold_rounds']} round(s), medians.", ""]
        trs = []
        for c in configs_of(rows, b):
            for n in ran(rows, b, c):
                f = med(rows, b, c, n, "minflt")
                if f is None:
                    trs.append([c, n, fail_cell(failures, b, c, n), "-", "-", "-"])
                    continue
                ms = [v / 1e6 for v in values(rows, b, c, n, "ns")]
                trs.append([c, n, num(f), fmt(med(rows, b, c, n, "faults_per_op")), spread(ms),
                            ratio_cell(rows, b, c, n, REFERENCE, "ns")])
        md += table(["config", "allocator", "faults", "faults/op", "ms", "x jemalloc time"], trs)
        md.append("")
    return md


PASSING = ("producer_consumer", "handoff", "phases")


def passing_section(rows, failures, mode, outdir, charts):
    """Small churn's blocks passed between threads: producer-consumer,
    hand-off, phases (small_churn --mode pc, handoff, phases)."""
    if not any(configs_of(rows, b) for b in PASSING):
        return []
    m = MODES[mode]
    md = ["## 3b. Small blocks passed between threads", "",
          "Small churn's sizes (8..1024 bytes, first and last byte written), one op = one "
          "malloc + one free of the same block, ops/s over the whole timed part. "
          "**producer_consumer**: one thread allocates, a second frees each block, passed "
          "through a 4,096-slot single-producer single-consumer ring whose indices are "
          "published every 64 blocks (the ring is not the cost); 200,000 untimed blocks, then "
          f"{m['small_ms']} ms. **handoff**: T chains of threads in generations; each thread "
          "inherits its predecessor's 10,000 live blocks (the predecessor has exited), frees "
          "every one in a scattered order, replacing each with one of its own, and exits, "
          "as server threads hand work on; thread creation is timed too; "
          f"{m['handoff_warm_gens']} untimed generation(s), then generations for "
          f"{m['small_ms']} ms. **phases**: 8 phases of 2, 3, 4, 2, ... threads (created, "
          "joined, then the next phase); each builds 10,000 blocks, frees those the previous "
          f"phase kept, does {m['phase_ops']:,} churn ops of which a quarter swap a block "
          "with a 1,000-slot array shared by all threads (blocks change threads within and "
          "across phases), frees all but 10% of its blocks and exits; fixed work, its peak "
          "RSS (VmHWM over the whole run) is the figure of interest. `phases=8 mixed`: the "
          "same with 2 blocks in 1,000 made 2,048 times larger (16 KiB..2 MiB, so large "
          "chunks too; qmalloc-noquar shows what qmalloc's quarantine adds). RSS after: once "
          "the main thread has freed what is left.", ""]
    trs, cf, data_ops, data_rss = [], [], {}, {}
    for b in PASSING:
        for c in configs_of(rows, b):
            label = f"{b} {c}"
            cf.append(label)
            for n in ran(rows, b, c):
                f = med(rows, b, c, n, "faults_per_op")
                if f is None:
                    trs.append([b, c, n, fail_cell(failures, b, c, n)] + ["-"] * 5)
                    continue
                data_ops[(label, n)] = med(rows, b, c, n, "ops_per_s")
                data_rss[(label, n)] = mib(med(rows, b, c, n, "peak_rss_kb"))
                trs.append([b, c, n, spread(values(rows, b, c, n, "ops_per_s")),
                            ratio_cell(rows, b, c, n, REFERENCE, "ops_per_s"),
                            fmt(mib(med(rows, b, c, n, "peak_rss_kb"))),
                            ratio_cell(rows, b, c, n, REFERENCE, "peak_rss_kb"),
                            fmt(mib(med(rows, b, c, n, "rss_after_kb"))), fmt(f, 2)])
    md += table(["bench", "config", "allocator", "ops/s", "x jemalloc ops/s", "peak RSS MiB",
                 "x jemalloc peak RSS", "RSS after MiB", "faults/op"], trs)
    nm = []
    for b in PASSING:
        nm += [n for n in names_of(rows, b) if n not in nm]
    charts["passing"] = chart(os.path.join(outdir, "passing.svg"),
                              "Small blocks passed between threads", cf, nm,
                              [("ops/s", True, data_ops), ("peak RSS MiB", False, data_rss)])
    md += ["", "![small blocks passed between threads](passing.svg)", ""]
    return md


def small_latency_section(rows, failures, mode):
    b = "small_record"
    if not configs_of(rows, b):
        return []
    m = MODES[mode]
    md = ["Latency of one call in small churn (separate runs, every call of "
          f"{m['small_record_ops']:,} ops per thread timed; {m['record_rounds']} round(s), "
          "medians), nanoseconds; the clock's own floor is the last column:", ""]
    trs = []
    for c in configs_of(rows, b):
        for n in ran(rows, b, c):
            if med(rows, b, c, n, LAT_KEYS["malloc"][0]) is None:
                trs.append([c, n, fail_cell(failures, b, c, n), "-", "-"])
                continue
            trs.append([c, n, triple(rows, b, c, n, LAT_KEYS["malloc"]),
                        triple(rows, b, c, n, LAT_KEYS["free"]),
                        num(med(rows, b, c, n, "clock_floor_ns"))])
    md += table(["config", "allocator", "malloc ns: p50 / p99 / p99.9",
                 "free ns: p50 / p99 / p99.9", "clock ns"], trs)
    md.append("")
    return md


def verdict(ok, text):
    return f"**{'met' if ok else 'MISSED'}**: {text}" if ok is not None else f"n/a: {text}"


def targets(rows, failures, by_path=(), maxed=()):
    out = ["## Targets", ""]
    L, S, R = "large_churn", "small_churn", "realloc_growth"

    def have(b, c, n):
        return bool(values(rows, b, c, n, "ops_per_s" if b != R else "ns_per_seq"))

    def why_missing(b, c, n):
        e = failures.get((b, c, n))
        return f"{n} failed ({e})" if e else f"{n} not measured"

    c = "W=8 T=1 page"
    q, je = med(rows, L, c, "qmalloc", "faults_per_op"), med(rows, L, c, REFERENCE,
                                                            "faults_per_op")
    if q is not None and je is not None:
        out.append("- Large churn W=8, 1 thread, page touch, quarantine on: faults/op "
                   + verdict(q <= je, f"qmalloc {fmt(q)} vs jemalloc {fmt(je)} "
                             f"({'at or below' if q <= je else fmt(q - je) + ' above, ' + fmt(q / je if je else float('inf')) + 'x'})"))
    else:
        out.append(f"- Large churn W=8 faults/op: n/a ({why_missing(L, c, 'qmalloc')})")
    if q is not None:
        out.append("- Large churn W=8, 1 thread, page touch, quarantine on: faults/op at most 1.0 "
                   + verdict(q <= 1.0, f"qmalloc {fmt(q)}"))
    # the belt's window (window_gb, window_frees) where it is on, else the
    # quarantine's own
    if option_default("window_gb", 0):
        win_mb = option_default("window_gb", 0) * 1024
        win_frees = option_default("window_frees", 0)
    else:
        win_mb = option_default("quarantine_min_mb", 0)
        win_frees = option_default("quarantine_min_frees", 0)
    for cc in configs_of(rows, "large_record"):
        # the least over every round: the guarantee is for every block; a
        # round in which no range came back at all (reuse_n 0) keeps it
        rs = [r for r in rows if r["bench"] == "large_record" and r["config"] == cc
              and r["alloc"] == "qmalloc" and r.get("ok") and r.get("reuse_n") is not None]
        back = [r for r in rs if float(r["reuse_n"]) > 0]
        fm = [float(r["reuse_frees_min"]) for r in back]
        mm = [float(r["reuse_mib_min"]) for r in back]
        if not rs:
            out.append(f"- Reuse distance, large churn {cc}: n/a "
                       f"({why_missing('large_record', cc, 'qmalloc')})")
            continue
        if not back:
            out.append(f"- Reuse distance, large churn {cc}: no range back before {win_frees} "
                       f"frees and {win_mb} MiB (the default window) "
                       + verdict(True, "no freed range came back at all in the log"))
            continue
        out.append(f"- Reuse distance, large churn {cc}: no range back before {win_frees} frees "
                   f"and {win_mb} MiB (the default window) "
                   + verdict(min(fm) >= win_frees and min(mm) >= win_mb,
                             f"qmalloc's least: {num(min(fm))} frees, {fmt(min(mm))} MiB"))
    for other, need in (("scudo", 3.0), ("efence", 2.0)):
        rs = ratios(rows, L, c, "qmalloc", other, "ops_per_s")
        if rs:
            m = median(rs)
            out.append(f"- Large churn W=8, 1 thread, page: ops/s at least {need:g}x {other}'s "
                       + verdict(m >= need, f"qmalloc/{other} = {spread(rs)} (paired by round)"
                                 + ("" if m >= need else f", {fmt(need / m)}x short")))
        else:
            out.append(f"- Large churn ops/s vs {other}: n/a ({why_missing(L, c, other)} or "
                       f"{why_missing(L, c, 'qmalloc')})")
    # the stacks kept for every large chunk (the default) against none
    for cc in configs_of(rows, L):
        rs = ratios(rows, L, cc, "qmalloc", "qmalloc-nostacks", "ops_per_s")
        if rs:
            m = median(rs)
            out.append(f"- Large churn {cc}: stacks cost at most 5% of ops/s "
                       + verdict(m >= 0.95, f"qmalloc/qmalloc-nostacks = {spread(rs)} "
                                 "(paired by round)"))
    lines, met, tot, failed = [], 0, 0, []
    for cc in configs_of(rows, L):
        rs = ratios(rows, L, cc, "qmalloc-noquar", REFERENCE, "ops_per_s")
        if not rs:
            failed.append(cc)
            continue
        tot += 1
        met += median(rs) >= 0.9
        lines.append(f"{cc}: {spread(rs)}" + ("" if median(rs) >= 0.9 else " (missed)"))
    if failed:
        lines.append(f"not measured in {', '.join(failed)}: "
                     + why_missing(L, failed[0], "qmalloc-noquar"))
    out.append("- Large churn with quarantine off: ops/s at least 0.9x jemalloc's "
               + verdict(met == tot if tot else None,
                         f"met in {met} of {tot} configs; qmalloc-noquar/jemalloc: " + "; ".join(lines)))
    # ops/s at least 0.8x jemalloc's: small churn and the configurations that
    # pass blocks between threads (issue 28)
    for b, c, what in ((S, "T=1", "Small churn, 1 thread"), (S, "T=2", "Small churn, 2 threads"),
                       ("producer_consumer", "pairs=1", "Producer-consumer, 1 pair"),
                       ("handoff", "T=1", "Hand-off, 1 chain"),
                       ("handoff", "T=2", "Hand-off, 2 chains")):
        if c not in configs_of(rows, b):
            continue
        rj = ratios(rows, b, c, "qmalloc", REFERENCE, "ops_per_s")
        if rj:
            out.append(f"- {what}: ops/s at least 0.8x jemalloc's "
                       + verdict(median(rj) >= 0.8, f"qmalloc/jemalloc = {spread(rj)} "
                                 "(paired by round)"))
        else:
            out.append(f"- {what} vs jemalloc: n/a ({why_missing(b, c, 'qmalloc')})")
    # peak RSS at most jemalloc's + 10%: small churn, phases, the real programs
    for b in (S, "phases", "programs"):
        for c in configs_of(rows, b):
            if c == "T=1 guarded":
                continue
            rr = ratios(rows, b, c, "qmalloc", REFERENCE, "peak_rss_kb")
            q = mib(med(rows, b, c, "qmalloc", "peak_rss_kb"))
            je = mib(med(rows, b, c, REFERENCE, "peak_rss_kb"))
            if not rr or q is None or je is None:
                continue
            out.append(f"- Peak RSS, {b} {c}: at most jemalloc's + 10% "
                       + verdict(median(rr) <= 1.1, f"qmalloc {fmt(q)} MiB vs jemalloc "
                                 f"{fmt(je)} MiB, qmalloc/jemalloc = {spread(rr)} "
                                 "(paired by round)"))
    c = "T=1"
    rsc = ratios(rows, S, c, "qmalloc", "scudo", "ops_per_s")
    if rsc:
        out.append("- Small churn, 1 thread: ops/s at least 4x Scudo's "
                   + verdict(median(rsc) >= 4, f"qmalloc/scudo = {spread(rsc)}"))
    # the allocators passed by path (e.g. hardened_malloc): each qmalloc
    # variant's small-churn ops/s over theirs, paired by round
    for other in [n for n in by_path if not n.startswith("qmalloc")]:
        for q in [n for n in names_of(rows, S) if n.startswith("qmalloc")]:
            for cc in configs_of(rows, S):
                rs = ratios(rows, S, cc, q, other, "ops_per_s")
                if rs:
                    out.append(f"- Small churn {cc}: {q}/{other} ops/s = {spread(rs)} "
                               "(paired by round)")
    # hardening=max (a qmalloc passed with that option) against hardened_malloc
    # passed by path: the 3x, in both thread counts
    for q in maxed:
        for other in [n for n in by_path if n.startswith("hardened_malloc")]:
            for cc in ("T=1", "T=2"):
                rs = ratios(rows, S, cc, q, other, "ops_per_s")
                if rs:
                    out.append(f"- Small churn {cc}, hardening=max: ops/s at least 3x {other}'s "
                               + verdict(median(rs) >= 3, f"{q}/{other} = {spread(rs)} "
                                         "(paired by round)"))
    rs = ratios(rows, S, "T=1", "qmalloc", "qmalloc-nosample", "ops_per_s")
    if rs:
        rate = option_default("sample_rate", "?")
        out.append(f"- Small churn, 1 thread, default sampling (sample_rate={rate}): ops/s within "
                   "3% of sampling off "
                   + verdict(median(rs) >= 0.97, f"qmalloc/qmalloc-nosample = {spread(rs)} "
                             "(paired by round)"))
    c = "T=1 guarded"
    for other, need in (("efence-pf", 10.0), ("duma", 3.0)):
        rs = ratios(rows, S, c, "qmalloc-guard-all", other, "ops_per_s")
        rr = ratios(rows, S, c, "qmalloc-guard-all", other, "peak_rss_kb")
        if not rs or not rr:
            out.append(f"- Small churn T=1 guard_all=1 vs {other}: n/a "
                       f"({why_missing(S, c, other)} or {why_missing(S, c, 'qmalloc-guard-all')})")
            continue
        out.append(f"- Small churn T=1, every allocation guarded: ops/s at least {need:g}x "
                   f"{other}'s " + verdict(median(rs) >= need, f"qmalloc-guard-all/{other} = "
                                           f"{spread(rs)} (paired by round)"))
        out.append(f"- Small churn T=1, every allocation guarded: peak RSS at most 2x {other}'s "
                   + verdict(median(rr) <= 2.0, f"qmalloc-guard-all/{other} = {spread(rr)}"))
    c = "+4 KiB from 4 KiB to 8 MiB"
    rg = ratios(rows, R, c, "qmalloc", "glibc", "ns_per_seq")
    if rg:
        out.append("- realloc +4 KiB steps to 8 MiB: no slower than glibc "
                   + verdict(median(rg) <= 1.0, f"qmalloc time / glibc time = {spread(rg)}"
                             + ("" if median(rg) <= 1 else f": {fmt((median(rg) - 1) * 100)}% slower")))
    else:
        out.append(f"- realloc steps: n/a ({why_missing(R, c, 'qmalloc')})")
    budget = quarantine_budget_mb()
    for cc in configs_of(rows, L):
        if not cc.startswith("W=64"):
            continue
        q = mib(med(rows, L, cc, "qmalloc", "peak_rss_kb"))
        je = mib(med(rows, L, cc, REFERENCE, "peak_rss_kb"))
        if q is None or je is None:
            out.append(f"- Peak RSS, large churn {cc}: n/a ({why_missing(L, cc, 'qmalloc')})")
            continue
        lim = je + budget
        out.append(f"- Peak RSS, large churn {cc}: at most jemalloc's + the quarantine budget "
                   f"({budget} MiB) "
                   + verdict(q <= lim, f"qmalloc {fmt(q)} MiB vs limit {fmt(lim)} MiB "
                             f"(jemalloc {fmt(je)} MiB)"
                             + ("" if q <= lim else f": {fmt(q - lim)} MiB over")))
    return out
