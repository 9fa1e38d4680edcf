"""The allocators compared: qmalloc and its variants, the ones installed, and
those passed by path (--with)."""

import glob
import hashlib
import os
import platform
import re
import sys

from .common import find_so


# ---- allocators ------------------------------------------------------------


class Alloc:
    def __init__(self, name, desc, preload=None, env=None, linked=False, note="", by_path=False,
                 guarded=False):
        self.name, self.desc, self.preload, self.env = name, desc, preload, env or {}
        self.linked, self.note, self.by_path = linked, note, by_path
        # guarded: every allocation on its own pages; runs only in small churn "T=1 guarded"
        self.guarded = guarded


def parse_with(spec, taken):
    """NAME=/path/lib.so[,env=K=V][,note=TEXT] -> Alloc. A note may hold commas;
    only ",env=" and ",note=" start a new field."""
    name, sep, rest = spec.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name) or not rest:
        sys.exit(f"run-bench: --with {spec!r}: expected NAME=/path/to/lib.so[,note=TEXT]")
    if name in taken:
        sys.exit(f"run-bench: --with {name}: that name is taken; choose another")
    fields = re.split(r",(?=(?:env|note)=)", rest)
    path, env, note = os.path.abspath(fields[0]), {}, ""
    for f in fields[1:]:
        key, _, val = f.partition("=")
        if key == "env":
            k, eq, v = val.partition("=")
            if not eq or not k:
                sys.exit(f"run-bench: --with {name}: env wants K=V, not {val!r}")
            env[k] = v
        else:
            note = val.strip()
    if not os.path.isfile(path):
        sys.exit(f"run-bench: --with {name}: {path} is not a file")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    desc = f"{name}, preloaded from {path} (passed by path, sha256 {digest})"
    if env:
        desc += " with " + " ".join(f"{k}={v}" for k, v in env.items())
    desc += ": " + (note or "no note given")
    return Alloc(name, desc, path, env, by_path=True)


def discover(build, base=""):
    lib = os.path.join(build, "src", "libqmalloc.so")
    if not os.path.exists(lib):
        sys.exit(f"run-bench: {lib} not found: build first (ninja -C {build})")
    arch = platform.machine()
    allocs = [
        Alloc("qmalloc", "qmalloc, quarantine on (default options), preloaded", lib),
        # the other profile a user chooses: every check on (the summary's
        # second row, and the hardening=max target's)
        Alloc("qmalloc-max", "qmalloc with QMALLOC_OPTIONS=hardening=max (every check the "
              "default leaves off for speed: zero_on_free, neighbour checks, free_delay)", lib,
              {"QMALLOC_OPTIONS": "hardening=max"}),
    ]
    if base:
        if not os.path.exists(base):
            sys.exit(f"run-bench: --base {base} not found")
        # another build of qmalloc (an earlier commit), run in the same rounds
        # as this one: a change's effect read side by side, not across runs
        allocs.append(Alloc("qmalloc-base", "qmalloc from --base, default options: " + base,
                            os.path.abspath(base)))
    allocs += [
        Alloc("qmalloc-noquar", "qmalloc with QMALLOC_OPTIONS=strategy=none (quarantine off)",
              lib, {"QMALLOC_OPTIONS": "strategy=none"}),
        Alloc("qmalloc-nostacks", "qmalloc with QMALLOC_OPTIONS=stack_frames=0 (no allocation "
              "and free stacks kept for large chunks)", lib, {"QMALLOC_OPTIONS": "stack_frames=0"}),
        Alloc("qmalloc-nosample", "qmalloc with QMALLOC_OPTIONS=sample_rate=0 (no sampled "
              "guarded chunks; the default build samples 1 in sample_rate small mallocs)",
              lib, {"QMALLOC_OPTIONS": "sample_rate=0"}),
        Alloc("qmalloc-guard-all", "qmalloc with QMALLOC_OPTIONS=guard_all=1 (every "
              "allocation in a guarded slot), small churn T=1 guarded only", lib,
              {"QMALLOC_OPTIONS": "guard_all=1"}, guarded=True),
        Alloc("glibc", "glibc malloc (no preload)"),
    ]
    notes = []
    je = find_so(["libjemalloc.so.2", "libjemalloc.so"])
    if je:
        allocs.append(Alloc("jemalloc", "jemalloc, preloaded: " + je, je))
    else:
        notes.append("jemalloc: no libjemalloc.so found; ratios to it are left out")
    if glob.glob(os.path.join(build, "bench", "*_je")):
        allocs.append(Alloc("jemalloc-linked", "jemalloc linked in (the *_je programs, "
                            "dependency('jemalloc'))", linked=True))
    else:
        notes.append("jemalloc-linked: the *_je programs were not built (no jemalloc "
                     "dependency at configure time)")
    others = [
        ("mimalloc", ["libmimalloc.so.2", "libmimalloc.so"], []),
        ("tcmalloc", ["libtcmalloc_minimal.so.4", "libtcmalloc.so.4"], []),
        ("scudo", [], [f"/usr/lib/llvm-*/lib/clang/*/lib/linux/"
                       f"libclang_rt.scudo_standalone-{arch}.so"]),
        ("efence", ["libefence.so.0", "libefence.so"], []),
    ]
    for name, names, globs in others:
        p = find_so(names, globs)
        if p:
            note = ""
            if name == "efence":
                note = ("Electric Fence runs in large churn only, 1 thread (quick mode: W=8 "
                        "page only, the target's config): it pays a fault per page and a "
                        "mapping per block, is not thread-safe, and small churn or realloc "
                        "growth (a copy per step) would take hours")
            allocs.append(Alloc(name, f"{name}, preloaded: {p}", p, note=note))
        else:
            notes.append(f"{name}: not installed, left out")
    # the tools that guard every allocation, in the configurations that catch
    # use-after-free: freed memory is never handed out again, kept inaccessible
    for name, names, env in (
            ("efence-pf", ["libefence.so.0", "libefence.so"],
             {"EF_PROTECT_FREE": "1", "EF_DISABLE_BANNER": "1"}),
            ("duma", ["libduma.so.0", "libduma.so"],
             {"DUMA_PROTECT_FREE": "1", "DUMA_DISABLE_BANNER": "1"})):
        p = find_so(names)
        if p:
            allocs.append(Alloc(name, f"{name}, preloaded: {p} with " + " ".join(
                f"{k}={v}" for k, v in env.items()), p, env, guarded=True,
                note="small churn T=1 guarded only (not thread-safe, or a mapping and a fault "
                     "per allocation)"))
        else:
            notes.append(f"{name}: not installed, left out")
    return allocs, notes
