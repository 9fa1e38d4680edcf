#!/usr/bin/env python3
# suite.py: the two halves of boot-test.sh that handle meson's test list.
# Owns: "plan" (which of qmalloc's meson tests can run in the guest, the
# guest's run script and the host files it needs) and "report" (the guest's
# console log back into a per-test and per-suite result table).
# A test runs in the guest exactly as meson would run it: same command, same
# arguments, same environment, same working directory, a longer time limit.
import argparse
import json
import os
import re
import shlex
import subprocess
import sys

# Suites taken from each build (see boot-test.sh). Everything else in meson's
# list needs programs a busybox guest does not have (python3, git, gcc).
STATIC_SUITES = {"unit", "kernel", "tools", "examples"}
SHARED_SUITES = {"linked", "preload", "hardening", "examples"}
# checks of the build's own files with host tools (nm, the source tree),
# which the guest has neither of: they say nothing of the kernel
HOST_ONLY = {"man-lists-options", "no-test-hooks", "no-dynamic-data"}
# a shell script's ". "$(dirname "$0")/FILE"": a file it reads beside it
SOURCED = re.compile(r'^\s*\.\s+"\$\(dirname "\$0"\)/([^"]+)"', re.M)
SAN_SUITES = {"unit"}
# the unit tests under ASan/UBSan run as ./qmalloc test runs them
SAN_ENV = {
    "ASAN_OPTIONS": "handle_segv=0:detect_leaks=0",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}
MARK = "@@QM"


def introspect(build):
    out = subprocess.run(["meson", "introspect", build, "--tests"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def shebang(path):
    with open(path, "rb") as f:
        line = f.readline(200)
    if not line.startswith(b"#!"):
        return []
    return line[2:].decode().split()


def which(name):
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK) and not os.path.isdir(p):
            return p
    return None


def ldd(path):
    """The shared objects an ELF file loads, its interpreter included."""
    r = subprocess.run(["ldd", path], capture_output=True, text=True)
    libs = []
    for line in r.stdout.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            libs.append(m.group(1))
    return libs


def suite_of(t):
    # meson prints suites as "project:suite"
    return {s.split(":")[-1] for s in t["suite"]}


def plan(o):
    """Writes OUTDIR/run.sh, OUTDIR/files.txt, OUTDIR/dirs.txt, OUTDIR/plan.json."""
    outdir, factor, static, shared, san = o.out, o.factor, o.static, o.shared, o.san
    extra = o.extra
    words = o.suites.split(",") if o.suites else []
    # "-PREFIX": leave out the tests whose name starts with it
    wanted = {w for w in words if w and not w.startswith("-")}
    unwanted = tuple(w[1:] for w in words if w.startswith("-") and len(w) > 1)
    tests, skipped, files, missing = [], [], set(), {}

    def want(t, name, allowed):
        s = suite_of(t)
        if not (s & allowed):
            return False
        if wanted and not (s & wanted) and name not in wanted:
            return False
        if unwanted and name.startswith(unwanted):
            if (name, "left out by -s") not in skipped:
                skipped.append((name, "left out by -s"))
            return False
        return True

    def add_file(p):
        if p in files:
            return
        files.add(p)
        if p.endswith(".sh"):  # what the script sources comes along
            with open(p, errors="replace") as f:
                for rel in SOURCED.findall(f.read()):
                    q = os.path.normpath(os.path.join(os.path.dirname(p), rel))
                    if os.path.isfile(q):
                        add_file(q)
        if is_elf(p):
            for lib in ldd(p):
                add_file(os.path.realpath(lib))
                files.add(os.path.normpath(lib))  # the name the loader looks for, as a link
        else:
            interp = shebang(p)
            if interp:
                prog = interp[0]
                if os.path.basename(prog) == "env" and len(interp) > 1:
                    prog = which(interp[1]) or prog
                if os.path.exists(prog) and not prog.startswith("/bin/busybox"):
                    add_file(os.path.realpath(prog))
                    files.add(prog)

    sources = [(static, STATIC_SUITES, ""), (shared, SHARED_SUITES, ""),
               (san, SAN_SUITES, "san-")]
    seen = set()
    for build, allowed, prefix in sources:
        if not build:
            continue
        for t in introspect(build):
            name = prefix + t["name"]
            if name in seen or not want(t, name, allowed):
                continue
            if t["name"] in HOST_ONLY:
                skipped.append((name, "checks the build's files with host tools"))
                seen.add(name)
                continue
            # examples: the static build has linked_static, the shared one demo
            if build == static and "examples" in suite_of(t) and not t["cmd"][0].startswith(static):
                continue
            cmd = t["cmd"]
            if not os.path.isabs(cmd[0]) or not os.path.exists(cmd[0]):
                missing.setdefault(name, "not built: %s" % cmd[0])
                continue
            if os.path.basename(cmd[0]).startswith("python"):
                skipped.append((name, "needs python3, which the guest does not have"))
                continue
            if any("\n" in a for a in cmd):
                skipped.append((name, "multi-line argument"))
                continue
            if build == static and is_elf(cmd[0]) and ldd_dynamic(cmd[0]):
                skipped.append((name, "not statically linked"))
                continue
            seen.add(name)
            cwd = t.get("workdir") or build
            for a in cmd:  # arguments naming files, absolute or from the test's directory
                f = a if os.path.isabs(a) else os.path.join(cwd, a)
                if "\0" not in f and os.path.isfile(f):
                    add_file(os.path.normpath(f))
            env = dict(t["env"])
            if prefix == "san-":
                env.update(SAN_ENV)
            tests.append({
                "name": name,
                "suite": sorted(suite_of(t))[0],
                "cmd": cmd,
                "env": env,
                "cwd": cwd,
                "timeout": int(max(30, t["timeout"]) * factor),
            })
    skipped += [(n, why) for n, why in missing.items() if n not in seen]
    # the kernel's own facts first (the probe's runs, the caller's programs):
    # a boot cut short by its time limit still has them
    first = []
    for i, e in enumerate(extra):  # "PROG ARGS...": a static program of the caller's
        argv = shlex.split(e)
        argv[0] = os.path.abspath(argv[0])
        add_file(argv[0])
        name = os.path.basename(argv[0])
        if any(t["name"] == name for t in tests):
            name += "-%d" % (i + 1)
        first.append({"name": name, "suite": "extra", "cmd": argv, "env": {},
                      "cwd": "/tmp", "timeout": int(300 * factor)})
    # the probe's verdict, several times over: it must not change between runs
    probe = os.path.join(static, "tools", "qmalloc-probe") if static else None
    if probe and os.path.exists(probe) and o.probe_runs > 0:
        add_file(probe)
        for i in range(o.probe_runs):
            first.append({"name": "probe-json-%d" % (i + 1), "suite": "probe",
                          "cmd": [probe, "--json"], "env": {}, "cwd": "/tmp",
                          "timeout": int(60 * factor)})
        first.append({"name": "probe-words", "suite": "probe", "cmd": [probe], "env": {},
                      "cwd": "/tmp", "timeout": int(60 * factor)})
    tests = first + tests

    lines = ["# generated by suite.py plan: one line per test",
             "t() { # NAME TIMEOUT DIR CMD...",
             "  n=$1 to=$2 d=$3; shift 3",
             "  echo \"%s BEGIN $n\"" % MARK,
             "  s=$(date +%s)",
             "  (cd \"$d\" && exec timeout -s KILL \"$to\" \"$@\") </dev/null 2>&1",
             "  rc=$?",
             "  echo \"%s END $n rc=$rc secs=$(( $(date +%%s) - s )) limit=$to\"" % MARK,
             "}"]
    for t in tests:
        envs = ["env"] + ["%s=%s" % kv for kv in sorted(t["env"].items())]
        argv = envs + t["cmd"]
        lines.append("t %s %d %s %s" % (shlex.quote(t["name"]), t["timeout"],
                                         shlex.quote(t["cwd"]),
                                         " ".join(shlex.quote(a) for a in argv)))
    dirs = sorted({t["cwd"] for t in tests})
    with open(os.path.join(outdir, "run.sh"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(outdir, "files.txt"), "w") as f:
        f.write("\n".join(sorted(files)) + "\n")
    with open(os.path.join(outdir, "dirs.txt"), "w") as f:
        f.write("\n".join(dirs) + "\n")
    with open(os.path.join(outdir, "plan.json"), "w") as f:
        json.dump({"tests": tests, "not_run": skipped}, f, indent=1)
    print("suite.py: %d tests for the guest, %d left out" % (len(tests), len(skipped)))


def ldd_dynamic(path):
    r = subprocess.run(["readelf", "-l", path], capture_output=True, text=True)
    return "INTERP" in r.stdout


# ---- report ----

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # gtest colours its output on a terminal-less console too
GTEST_LINE = re.compile(r"^\[\s+(OK|FAILED|SKIPPED)\s+\] (\S+\.\S+)(?: \(\d+ ms\))?\s*$")


def parse_log(path):
    """Returns (meta, {test: {"rc", "secs", "limit", "out": [lines]}}, probes)."""
    meta, res, cur = {}, {}, None
    with open(path, errors="replace") as f:
        for raw in f:
            line = ANSI.sub("", raw.rstrip("\r\n"))
            i = line.find(MARK + " ")
            if i >= 0:
                words = line[i + len(MARK) + 1:].split(" ", 1)
                key, rest = words[0], words[1] if len(words) > 1 else ""
                if key == "BEGIN":
                    cur = rest.strip()
                    res[cur] = {"rc": None, "out": []}
                elif key == "END":
                    name, *kv = rest.split()
                    d = dict(x.split("=", 1) for x in kv)
                    if name in res:
                        res[name].update({k: int(v) for k, v in d.items()})
                    cur = None
                else:
                    meta.setdefault(key, []).append(rest)
                continue
            if cur is not None:
                res[cur]["out"].append(line)
    return meta, res


def gtest_counts(out):
    ok, failed, skipped, death_ok, death_bad = 0, [], 0, 0, []
    seen_skip = set()  # gtest lists skipped tests again at the end
    for line in out:
        m = GTEST_LINE.match(line)
        if not m:
            continue
        kind, name = m.groups()
        death = "DeathTest" in name
        if kind == "OK":
            ok += 1
            death_ok += death
        elif kind == "SKIPPED" and name not in seen_skip:
            seen_skip.add(name)
            skipped += 1
        elif kind == "FAILED" and name not in failed:
            failed.append(name)
            if death:
                death_bad.append(name)
    return ok, failed, skipped, death_ok, death_bad


def verdict(r):
    if r is None:
        return "NOT RUN"
    rc = r.get("rc")
    if rc is None:
        return "NO END"  # the guest died or the time limit hit mid-test
    if rc == 0:
        return "PASS"
    if rc in (77, 4):  # meson's skip; kselftest's KSFT_SKIP
        return "SKIP"
    if rc == 137 and r.get("secs", 0) >= r.get("limit", 1 << 30):
        return "TIMEOUT"
    return "FAIL(rc=%d)" % rc


def probe_runs(res):
    runs = []
    for name in sorted(res):
        if not name.startswith("probe-json-"):
            continue
        text = "\n".join(res[name]["out"])
        j = text[text.find("{"):text.rfind("}") + 1]
        try:
            d = json.loads(j)
        except ValueError:
            runs.append(None)
            continue
        runs.append(d)
    return runs


def report(a):
    """Prints the result table; 0 when everything passed or skipped, else 1."""
    plan_path, log = a.plan, a.log
    with open(plan_path) as f:
        p = json.load(f)
    meta, res = parse_log(log)
    kernel = (meta.get("KERNEL") or ["?"])[0]
    print("kernel: %s" % kernel)
    for k in ("CMDLINE", "CPUS", "THP", "CLOCK"):
        if k in meta:
            print("%s: %s" % (k.lower(), meta[k][0]))
    bad = 0
    runs = probe_runs(res)
    verdicts = []
    for d in runs:
        if d is None:
            verdicts.append("unreadable")
            bad += 1
        else:
            verdicts.append("%s/%s/%d" % ("fast" if d.get("fast_path_dirty") else "slow",
                                          d.get("strategy"), d.get("faults_dirty", -1)))
    if runs:
        print("probe (verdict/strategy/faults rewriting %s pages), %d runs: %s" % (
            runs[0].get("probe_pages", "?") if runs[0] else "?", len(runs), " ".join(verdicts)))
        # the belt's way, and the faults of a reuse each way: pages moved
        # PROT_NONE then opened (protect), pages moved RW (move)
        ways = ["%s/%s/%s" % (d.get("belt_way_in_force", d.get("belt_way")),
                              d.get("faults_move_protect"), d.get("faults_move_rw"))
                for d in runs if d]
        print("belt (way in force/faults protect/faults move), %d runs: %s" % (
            len(ways), " ".join(ways)))
        costs = {}
        for d in runs:
            for c in (d or {}).get("belt_costs", []):
                if c.get("available"):
                    costs.setdefault((c["way"], c["bytes"]), []).append(c["faults_per_cycle"])
        if costs:
            print("belt cost, faults per reuse (min-max over runs): " + ", ".join(
                "%s %d KiB %.1f-%.1f" % (w, b >> 10, min(v), max(v))
                for (w, b), v in sorted(costs.items(), key=lambda x: (x[0][1], x[0][0]))))
    print()
    print("%-34s %-10s %6s %5s %5s %s" % ("test", "result", "passed", "skip", "death", "notes"))
    suites = {}
    tot_death_ok = 0
    for t in p["tests"]:
        r = res.get(t["name"])
        v = verdict(r)
        out = r["out"] if r else []
        ok, failed, skipped, death_ok, death_bad = gtest_counts(out)
        tot_death_ok += death_ok
        notes = ""
        if failed:
            notes = "failed: " + ", ".join(failed[:6]) + (" ..." if len(failed) > 6 else "")
        elif v == "SKIP" and out:
            notes = next((x.strip() for x in reversed(out) if x.strip()), "")[:70]
        elif v != "PASS" and out:
            notes = " | ".join(x.strip() for x in out[-3:])[:90]
        elif not ok and out:
            tail = [x for x in out if re.search(r"\d+ passed, \d+ failed", x)]
            notes = tail[-1].strip() if tail else ""
        if r and "secs" in r:
            notes = ("%ds " % r["secs"]) + notes
        print("%-34s %-10s %6s %5s %5s %s" % (t["name"], v, ok or "", skipped or "",
                                              death_ok or "", notes))
        s = suites.setdefault(t["suite"], [0, 0, 0])
        if v == "PASS":
            s[0] += 1
        elif v == "SKIP":
            s[1] += 1
        else:
            s[2] += 1
            bad += 1
    print()
    for s, (a, b, c) in sorted(suites.items()):
        print("suite %-10s %d passed, %d skipped, %d failed" % (s, a, b, c))
    print("death tests passed (gtest *DeathTest*): %d" % tot_death_ok)
    for name, why in p["not_run"]:
        print("not run in the guest: %s (%s)" % (name, why))
    if "DONE" not in meta:
        print("the guest did not finish: no end marker in %s" % log)
        bad += 1
    print("boot-test: %s" % ("all passed" if bad == 0 else "%d problems" % bad))
    return 0 if bad == 0 else 1


def main():
    ap = argparse.ArgumentParser(description="boot-test.sh's test plan and report")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--out", required=True)
    p.add_argument("--factor", type=float, default=10.0, help="time limits: meson's times this")
    p.add_argument("--static", default="")
    p.add_argument("--shared", default="")
    p.add_argument("--san", default="")
    p.add_argument("--suites", default="")
    p.add_argument("--probe-runs", type=int, default=5)
    p.add_argument("extra", nargs="*")
    r = sub.add_parser("report")
    r.add_argument("plan")
    r.add_argument("log")
    a = ap.parse_args()
    return plan(a) if a.cmd == "plan" else report(a)


if __name__ == "__main__":
    sys.exit(main())
