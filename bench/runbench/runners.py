"""How a run is made: one program under one allocator (its environment, CPU
pinning, result line), every run of the plan interleaved across
allocators, the planted bugs, and the cost check under cachegrind."""

import csv
import datetime
import hashlib
import os
import re
import resource
import signal
import subprocess
import sys
import time

from .common import ROOT, sh
from .workloads import BUGS, bench_plan, command_line, rounds_of


# ---- running one program ---------------------------------------------------


PIN_CPUS = sorted(os.sched_getaffinity(0))


def alloc_env(alloc):
    """The environment of a run under alloc: the caller's, without any other
    allocator's preload or options."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "QMALLOC_OPTIONS", "MALLOC_CONF", "MIMALLOC_OPTIONS",
                        "SCUDO_OPTIONS")}
    env["EF_DISABLE_BANNER"] = "1"
    if alloc:
        if alloc.preload:
            env["LD_PRELOAD"] = alloc.preload
        env.update(alloc.env)
    return env


class Runner:
    def __init__(self, build, total, quiet):
        self.build, self.total, self.done, self.t0 = build, total, 0, time.time()
        self.tty = sys.stderr.isatty() and not quiet
        self.quiet = quiet

    def progress(self, what):
        self.done += 1
        el = time.time() - self.t0
        eta = el / self.done * (self.total - self.done) if self.done else 0
        line = (f"[{self.done:4d}/{self.total}  {int(el) // 60}m{int(el) % 60:02d}s  "
                f"eta {int(eta) // 60}m{int(eta) % 60:02d}s] {what}")
        if self.tty:
            sys.stderr.write("\r\033[K" + line[:150])
        elif not self.quiet:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def run(self, prog, args, alloc, timeout):
        """Runs BUILD/bench/prog under alloc; returns (dict of results, error string)."""
        exe = os.path.join(self.build, "bench", prog + ("_je" if alloc and alloc.linked else ""))
        env = alloc_env(alloc)
        # one-thread runs all on one CPU, the same for every allocator: on a VM the
        # CPUs differ (one ran every allocator about 40% slower than the other
        # here), and a run the scheduler moves between them is neither
        pin = None
        sa = [str(a) for a in args]
        one = prog == "program_time" or (
            "--threads" in sa and sa[sa.index("--threads") + 1] == "1")
        if one and len(PIN_CPUS) > 1:
            pin = lambda: os.sched_setaffinity(0, {PIN_CPUS[-1]})  # noqa: E731
        t0 = time.time()
        try:
            p = subprocess.run([exe] + sa, env=env, capture_output=True,
                               text=True, timeout=timeout, preexec_fn=pin)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout} s"
        except OSError as e:
            return None, str(e)
        res = None
        for line in p.stdout.splitlines():
            if line.startswith("result "):
                res = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
        if p.returncode != 0 or res is None or "error" in (res or {}):
            if res and "error" in res:
                return None, res["error"]
            why = (f"killed by {signal.Signals(-p.returncode).name}" if p.returncode < 0
                   else f"exit {p.returncode}")
            err = [ln for ln in p.stderr.splitlines() if ln.strip()]
            return None, why + (": " + err[-1][:200] if err else "")
        for k, v in res.items():
            try:
                res[k] = float(v)
            except ValueError:
                pass
        res["wall_s"] = round(time.time() - t0, 3)
        return res, None


def run_all(build, mode, allocs, only, quiet):
    # "small_churn" keeps every config of a benchmark, "small_churn:T=1" one
    plan = [p for p in bench_plan(mode, allocs, build)
            if not only or p[0] in only or f"{p[0]}:{p[1]}" in only]
    total = sum(len(r) * rounds_of(mode, b) for b, _, _, r in plan)
    planted = [a for a in allocs if not a.linked] if not only or "detection" in only else []
    total += len(planted) * len(BUGS)
    runner = Runner(build, total, quiet)
    rows, failures = [], {}
    for bench, label, cfg, runs in plan:
        rounds = rounds_of(mode, bench)
        for rnd in range(1, rounds + 1):
            for who, prog, args, timeout in runs:  # A B C A B C ...
                name = who if isinstance(who, str) else who.name
                runner.progress(f"{bench} {label}: {name}, round {rnd}/{rounds}")
                alloc = None if isinstance(who, str) else who
                res, err = runner.run(prog, args, alloc, timeout)
                row = {"bench": bench, "config": label, "alloc": name, "round": rnd,
                       "ok": int(res is not None), "mode": mode,
                       "cmd": command_line(prog, args, alloc)}
                row.update(cfg)
                if res:
                    row.update({k: v for k, v in res.items() if k not in row})
                else:
                    row["error"] = err
                    failures.setdefault((bench, label, name), err)
                rows.append(row)
    for alloc in planted:
        for bug, _ in BUGS:
            runner.progress(f"detection {bug}: {alloc.name}")
            rows.append(run_planted(build, alloc, bug, mode))
    if runner.tty:
        sys.stderr.write("\n")
    return rows, failures, time.time() - runner.t0


def run_planted(build, alloc, bug, mode):
    """One planted bug under alloc: a row whose outcome says whether the
    process was stopped and when, from the last stage it wrote: at once (at
    the faulty access or call), later, at exit; or missed (it ran to its
    end), warned (it ran to its end but the allocator said something)."""
    exe = os.path.join(build, "bench", "planted")
    args = ["--bug", bug]
    row = {"bench": "detection", "config": bug, "alloc": alloc.name, "round": 1, "ok": 1,
           "mode": mode, "cmd": command_line("planted", args, alloc)}

    def no_core():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    try:
        p = subprocess.run([exe] + args, env=alloc_env(alloc), capture_output=True, text=True,
                           timeout=120, preexec_fn=no_core, errors="replace")
    except (OSError, subprocess.SubprocessError) as e:
        row.update(ok=0, error=str(e))
        return row
    stages = re.findall(r"^stage=(\w+)$", p.stdout, re.M)
    last = stages[-1] if stages else ""
    said = [ln.strip() for ln in p.stderr.splitlines()
            if ln.strip() and not ln.startswith((" ", "\t"))]
    row["message"] = said[0][:160] if said else ""
    if p.returncode < 0:
        try:
            row["how"] = signal.Signals(-p.returncode).name
        except ValueError:
            row["how"] = f"signal {-p.returncode}"
    else:
        row["how"] = f"exit {p.returncode}"
    if not last:
        row.update(ok=0, error=f"{row['how']} before the bug was planted: " + row["message"])
    elif p.returncode == 0 and last == "end":
        row["outcome"] = "warned" if said else "missed"
    else:
        row["outcome"] = {"bug": "at once", "after": "later", "end": "at exit"}[last]
    return row


# ---- the cost check (cachegrind) -----------------------------------------------


_COST = []


def cost_module():
    """bench/cost-check (a script, no .py), which counts an op of small churn
    under cachegrind, loaded as a module once."""
    if not _COST:
        import importlib.util
        from importlib.machinery import SourceFileLoader
        loader = SourceFileLoader("cost_check", os.path.join(ROOT, "bench", "cost-check"))
        mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("cost_check", loader))
        loader.exec_module(mod)
        _COST.append(mod)
    return _COST[0]


def file_sha(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:12]
    except OSError:
        return ""


def run_cost(build, allocs, quiet):
    """Each allocator that can run under valgrind, counted; the rows of cost.csv."""
    cc = cost_module()
    # guarded allocators map pages per block (hours under cachegrind) and
    # qmalloc's variants differ from the default in large chunks only
    skip = {"efence", "qmalloc-noquar", "qmalloc-nostacks", "qmalloc-nosample"}
    todo = [a for a in allocs if not a.guarded and not a.linked and a.name not in skip]
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    tree = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    out = []
    for i, a in enumerate(todo, 1):
        if not quiet:
            sys.stderr.write(f"run-bench: cost {i}/{len(todo)}: {a.name} under cachegrind\n")
        r = cc.measure(build, a.preload, a.env)
        row = {"alloc": a.name, "ok": int("error" not in r), "error": r.get("error", ""),
               "attempts": r.get("attempts", ""), "ops": cc.OPS, "warm": cc.WARM,
               "date": date, "tree": tree, "geometry": " ".join(cc.GEOMETRY),
               "lib_sha256": file_sha(os.path.join(build, "src", "libqmalloc.so"))}
        for k in ("alloc_ir", "total_ir", "d1", "ll"):
            row[k] = r.get(k, "")
        out.append(row)
    with open(os.path.join(build, "bench", "cost.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(out[0]) if out else ["alloc"])
        w.writeheader()
        w.writerows(out)
    return out, cc


def load_cost(build):
    """cost.csv's rows by allocator ({} if there is none)."""
    path = os.path.join(build, "bench", "cost.csv")
    if not os.path.exists(path):
        return {}
    out = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            r["ok"] = int(r.get("ok") or 0)
            for k in ("alloc_ir", "total_ir", "d1", "ll"):
                try:
                    r[k] = float(r[k])
                except (KeyError, ValueError):
                    r[k] = None
            out[r["alloc"]] = r
    return out
