"""The small helpers every part uses: running a command, reading a file,
medians and number formats, finding an installed library."""

import glob
import math
import os
import statistics
import subprocess


# the checkout: bench/runbench/common.py is three levels below it
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- small helpers ---------------------------------------------------------


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def median(v):
    return statistics.median(v) if v else None


def fmt(x, digits=3):
    """A number with `digits` significant digits, thousands kept whole."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if x == 0:
        return "0"
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    return f"{x:.{max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))}f}"


def spread(vals, digits=3):
    """median [min..max]"""
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    if len(vals) == 1:
        return fmt(vals[0], digits)
    return f"{fmt(median(vals), digits)} [{fmt(min(vals), digits)}..{fmt(max(vals), digits)}]"


def ldconfig_find(name):
    out = sh(["/sbin/ldconfig", "-p"]) or sh(["ldconfig", "-p"])
    for line in out.splitlines():
        line = line.strip()
        if line.startswith(name + " ") and "=>" in line:
            path = line.split("=>", 1)[1].strip()
            if os.path.exists(path):
                return path
    return None


def find_so(names, globs=()):
    for n in names:
        p = ldconfig_find(n)
        if p:
            return p
        for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib",
                  "/usr/local/lib", "/usr/lib64"):
            if os.path.exists(os.path.join(d, n)):
                return os.path.join(d, n)
    for g in globs:
        hits = sorted(glob.glob(g))
        if hits:
            return hits[-1]
    return None


def package_of(path):
    """Debian package and version that installed path, for the report."""
    out = sh(["dpkg", "-S", os.path.realpath(path)]) or sh(["dpkg", "-S", path])
    if not out:
        return ""
    pkg = out.split(":", 1)[0].split(",")[0].strip()
    ver = sh(["dpkg-query", "-W", "-f=${Version}", pkg])
    return f"{pkg} {ver}".strip()
