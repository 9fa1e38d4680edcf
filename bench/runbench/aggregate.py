"""The rows of a run read back: series, medians and ratios per benchmark,
configuration and allocator, table cells, and the machine's facts."""

import os
import platform
import re
import subprocess

from .common import ROOT, fmt, median, read, spread


# ---- aggregation -----------------------------------------------------------


def series(rows, bench, label, alloc, key):
    """The values of key by round."""
    return {r["round"]: r.get(key) for r in rows
            if r["bench"] == bench and r["config"] == label and r["alloc"] == alloc and r["ok"]
            and isinstance(r.get(key), float)}


def values(rows, bench, label, alloc, key):
    return list(series(rows, bench, label, alloc, key).values())


def ratios(rows, bench, label, alloc, ref, key):
    """key(alloc) / key(ref), paired round by round."""
    a = series(rows, bench, label, alloc, key)
    b = series(rows, bench, label, ref, key)
    return [a[r] / b[r] for r in a if r in b and b[r]]


def med(rows, bench, label, alloc, key):
    return median(values(rows, bench, label, alloc, key))


def mib(kb):
    return None if kb is None else kb / 1024.0


# ---- the report ------------------------------------------------------------


def probe_info(build):
    info = {}
    exe = os.path.join(build, "bench", "bench_probe")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "QMALLOC_OPTIONS")}
    out = ""
    if os.path.exists(exe):
        out = subprocess.run([exe], capture_output=True, text=True, env=env).stdout
    elif os.path.exists(os.path.join(build, "tools", "qmalloc-probe")):
        out = subprocess.run([os.path.join(build, "tools", "qmalloc-probe")], capture_output=True,
                             text=True, env=env).stdout
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            info[k.strip()] = v.strip()
    return info


def option_default(name, fallback):
    """An option's default from src/options.def (the report's targets follow it)."""
    m = re.search(r"QM_OPT\(" + name + r",\s*UINT,\s*(\d+)",
                  read(os.path.join(ROOT, "src", "options.def")))
    return int(m.group(1)) if m else fallback


def quarantine_budget_mb():
    """The default quarantine_mb (the report's RSS target)."""
    return option_default("quarantine_mb", 64)


def machine_lines():
    cpu = re.search(r"model name\s*:\s*(.*)", read("/proc/cpuinfo"))
    mem = re.search(r"MemTotal:\s*(\d+)", read("/proc/meminfo"))
    thp = read("/sys/kernel/mm/transparent_hugepage/enabled").strip()
    return [
        f"- Machine: {os.cpu_count()} CPUs ({cpu.group(1) if cpu else 'unknown CPU'}), "
        f"{int(mem.group(1)) / 1048576:.1f} GiB memory" if mem else "- Machine: unknown",
        f"- Kernel: {platform.release()} ({platform.machine()}); "
        f"vm.max_map_count {read('/proc/sys/vm/max_map_count').strip()}; THP {thp}",
    ]


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def configs_of(rows, bench):
    seen = []
    for r in rows:
        if r["bench"] == bench and r["config"] not in seen:
            seen.append(r["config"])
    return seen


def names_of(rows, bench):
    seen = []
    for r in rows:
        if r["bench"] == bench and r["alloc"] not in seen:
            seen.append(r["alloc"])
    return seen


def ran(rows, bench, label):
    """The allocators (or methods) that ran in this config, in order."""
    seen = []
    for r in rows:
        if r["bench"] == bench and r["config"] == label and r["alloc"] not in seen:
            seen.append(r["alloc"])
    return seen


def ratio_cell(rows, bench, label, name, ref, key):
    if name == ref:
        return "1"
    rs = ratios(rows, bench, label, name, ref, key)
    return spread(rs, 3) if rs else "-"


def fail_cell(failures, bench, label, name):
    err = failures.get((bench, label, name))
    return f"failed: {err}" if err else "-"


def num(x, digits=3):
    """A count as a whole number, anything else as fmt() does."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return fmt(x, digits)


def triple(rows, bench, c, n, keys, scale=1.0, digits=3):
    """'a / b / c' of the medians of keys (each divided by scale)."""
    out = []
    for k in keys:
        v = med(rows, bench, c, n, k)
        out.append(num(v / scale, digits) if v is not None else "-")
    return " / ".join(out)


LAT_KEYS = {kind: [f"lat_{kind}_p50_ns", f"lat_{kind}_p99_ns", f"lat_{kind}_p999_ns"]
            for kind in ("malloc", "free")}
