"""The summary: the one table (and plot) a user compares, qmalloc's two
profiles first."""

import math
import os
import shutil
import subprocess

from .common import fmt, median
from .workloads import BUGS, CAUGHT
from .aggregate import configs_of, med, mib, ratios, table
from .charts import PALETTE


# ---- the summary: what a user compares ---------------------------------------

SUMMARY_MD = []  # the last report's summary table, printed at the end of a run


# qmalloc's variants that isolate one of its costs, and jemalloc linked in
# rather than preloaded: in the sections below, not in the summary
SUMMARY_SKIP = ("qmalloc-noquar", "qmalloc-nostacks", "qmalloc-nosample", "qmalloc-guard-all",
                "jemalloc-linked")


LARGE_CFG, SMALL_CFG, PHASES_CFG = "W=8 T=1 page", "T=1", "phases=8"


# the summary's columns: key, header, plot label, log scale in the plot
SUMMARY_COLS = [
    ("small_ns", "small churn ns/op", "small churn: ns per op (T=1; guarded allocators: their "
     "guarded run)", True),
    ("large_us", "large churn us/op", "large churn: us per op (W=8, T=1)", True),
    ("progs", "real programs, time x glibc", "real programs: time / glibc's (geomean)", False),
    ("faults", "large churn faults/op", "large churn: page faults per op", True),
    ("rss", "peak RSS MiB", "peak RSS MiB (phases=8)", False),
    ("caught", "planted bugs caught", "planted bugs caught", False),
    ("instr", "allocator instr/op", "allocator instructions per op (cachegrind)", False),
]


def summary_names(rows, cost):
    """qmalloc and qmalloc-max first, then every other allocator measured."""
    seen = []
    for r in rows:
        if r["bench"] != "seed_loop" and r["alloc"] not in seen:
            seen.append(r["alloc"])
    seen += [n for n in cost if n not in seen]
    seen = [n for n in seen if n not in SUMMARY_SKIP]
    first = [n for n in ("qmalloc", "qmalloc-max") if n in seen]
    return first + [n for n in seen if n not in first]


def geomean(v):
    v = [x for x in v if x and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def summary_metrics(rows, cost, n):
    S, L = "small_churn", "large_churn"
    m = {}
    ops = med(rows, S, SMALL_CFG, n, "ops_per_s")
    m["small_guarded"] = ops is None and med(rows, S, "T=1 guarded", n, "ops_per_s") is not None
    if m["small_guarded"]:
        ops = med(rows, S, "T=1 guarded", n, "ops_per_s")
    m["small_ns"] = 1e9 / ops if ops else None
    lo = med(rows, L, LARGE_CFG, n, "ops_per_s")
    m["large_us"] = 1e6 / lo if lo else None
    m["faults"] = med(rows, L, LARGE_CFG, n, "faults_per_op")
    m["rss"] = mib(med(rows, "phases", PHASES_CFG, n, "peak_rss_kb"))
    m["progs"] = geomean([median(ratios(rows, "programs", c, n, "glibc", "ms"))
                          for c in configs_of(rows, "programs")])
    det = [r for r in rows if r["bench"] == "detection" and r["alloc"] == n and r.get("ok")]
    m["caught"] = sum(r.get("outcome") in CAUGHT for r in det) if det else None
    m["planted"] = len(det)
    c = cost.get(n)
    m["instr"] = c["alloc_ir"] if c and c.get("ok") else None
    return m


def summary_cell(key, m):
    v = m.get(key)
    if v is None:
        return "-"
    if key == "small_ns":
        return fmt(v) + (" (g)" if m["small_guarded"] else "")
    if key == "caught":
        return f"{v} of {m['planted']}"
    if key in ("progs", "faults"):
        return fmt(v)
    return fmt(v, 3) if key != "instr" else f"{v:,.0f}"


def summary_section(rows, cost, outdir):
    """The table and plot the report opens with."""
    names = summary_names(rows, cost)
    if not names:
        return [], (None, "nothing was measured")
    ms = {n: summary_metrics(rows, cost, n) for n in names}
    cols = [c for c in SUMMARY_COLS if any(ms[n].get(c[0]) is not None for n in names)]
    md = table(["allocator"] + [c[1] for c in cols],
               [[f"**{n}**" if n.startswith("qmalloc") else n]
                + [summary_cell(c[0], ms[n]) for c in cols] for n in names])
    have = {c[0] for c in cols}
    notes = []
    if "small_ns" in have:
        notes.append("small churn: random sizes 8..1024 bytes, 10,000 live blocks, one thread, "
                     "a malloc and a free per op (section 3); (g): measured only in the guarded "
                     "config, the one such an allocator runs in")
    if "large_us" in have:
        notes.append("large churn: 128 KiB..4 MiB, 8 live, one byte written per page "
                     "(section 2); its faults/op is the figure qmalloc's quarantine is built "
                     "around")
    if "progs" in have:
        notes.append("real programs: wall time over glibc's, paired by round, geometric mean "
                     f"over {', '.join(configs_of(rows, 'programs'))} (section 5)")
    if "rss" in have:
        notes.append("peak RSS: VmHWM of small churn's phases run, blocks passed between "
                     "2 to 4 threads in 8 phases (section 3b)")
    if "caught" in have:
        notes.append("planted bugs: " + ", ".join(b[1] for b in BUGS) + "; caught: the process "
                     "was stopped (at once, later or at exit; section 6)")
    if "instr" in have:
        notes.append("allocator instructions per op of small churn, counted by cachegrind "
                     "(section 7)")
    md += [""] + [f"- {t}" for t in notes]
    plot = summary_plot(outdir, names, ms, cols)
    return md, plot


def summary_plot(outdir, names, ms, cols):
    """summary.png beside the report (gnuplot); (file, None) or (None, why)."""
    gp = shutil.which("gnuplot")
    path = os.path.join(outdir, "summary.png")
    if os.path.exists(path):
        os.unlink(path)
    if not gp:
        return None, ("gnuplot is not installed (apt-get install gnuplot-nox; ./qmalloc bench "
                      "installs it)")
    panels = [c for c in cols if sum(ms[n].get(c[0]) is not None for n in names) > 0]
    per_row = 2
    nrows = (len(panels) + per_row - 1) // per_row
    color = {n: int(PALETTE[i % len(PALETTE)][1:], 16) for i, n in enumerate(names)}

    def q(text):  # a gnuplot string
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    def script(term):
        out = [f"set terminal {term} noenhanced size 1400,{380 * nrows + 60}"
               + (" font 'sans,10'" if term == "pngcairo" else ""),
               f"set output {q(path)}", "set style fill solid 0.85 border -1",
               "set boxwidth 0.7", "set grid ytics", "set xtics rotate by -35 nomirror scale 0",
               "unset key", "set bmargin 6",
               f"set multiplot layout {nrows},{per_row} title "
               + q("qmalloc against other allocators (lower is better, but for bugs caught)")]
        for k, (key, _, label, log) in enumerate(panels):
            dat = os.path.join(outdir, f"summary.{k}.dat")
            vals = [(n, ms[n][key]) for n in names if ms[n].get(key) is not None]
            floor = None
            if log:
                pos = [v for _, v in vals if v > 0]
                floor = 10 ** math.floor(math.log10(min(pos) / 10)) if pos else 1e-4
            with open(dat, "w") as f:
                for n, v in vals:
                    f.write(f"{q(n)} {max(v, floor) if log else v:.6g} {color[n]}\n")
            zero = log and any(v <= 0 for _, v in vals)
            out.append("set title " + q(label + (" (log scale; zero drawn at its floor)" if zero
                                                 else " (log scale)" if log else "")))
            out.append("set logscale y" if log else "unset logscale y")
            top = f"{max(ms[n].get('planted') or 0 for n in names) + 0.5:g}" if key == "caught" \
                else "*"
            out.append(f"set yrange [{floor:g}:{top}]" if log else f"set yrange [0:{top}]")
            out.append(f"plot {q(dat)} using 0:2:3:xtic(1) with boxes lc rgb variable")
        out.append("unset multiplot")
        return "\n".join(out) + "\n"

    for term in ("pngcairo", "png"):
        try:
            p = subprocess.run([gp], input=script(term), capture_output=True, text=True,
                               timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"gnuplot failed: {e}"
        if p.returncode == 0 and os.path.exists(path) and os.path.getsize(path) > 0:
            return "summary.png", None
    return None, "gnuplot failed: " + (p.stderr.strip().splitlines() or ["?"])[-1]
