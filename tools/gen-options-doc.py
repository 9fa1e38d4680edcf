#!/usr/bin/env python3
# gen-options-doc.py: writes docs/options.md, the options reference, from
# src/platform/options.def (the table the option parser is built from), so the page
# lists exactly the options there are. Test options-doc-current checks it.
# usage: gen-options-doc.py [OPTIONS_DEF [OUT]]   (OUT '-' is stdout)
import os
import re
import sys

HEAD = """\
# Options

<!-- Generated from src/platform/options.def by tools/gen-options-doc.py: edit those, not this. -->

Options are set in one environment variable, `name=value` pairs separated by
`:`:

```
QMALLOC_OPTIONS=hardening=max:log_path=/tmp/qm ./prog
```

A program linked with qmalloc can also define
`const char *qmalloc_default_options(void)`; `QMALLOC_OPTIONS` wins over it.
If that function allocates, its requests are served from a small start-up
arena, so nothing is fixed from the defaults before the options are read.

- An unknown name warns (naming a known one one or two edits away: `did you
  mean 'quarantine_mb'?`) and the rest still applies.
- A malformed or out-of-range value warns, naming the option and its range,
  and keeps the default.
- What the variable holds is printed with control bytes, bytes past 0x7e and
  backslashes escaped (`\\x0a`), so no value can print a line of its own.
- In secure execution (`AT_SECURE`: a set-user-ID or set-group-ID program, or
  one with file capabilities) `QMALLOC_OPTIONS` is ignored, with one warning,
  as glibc ignores its `MALLOC_` variables; the program's own
  `qmalloc_default_options()` still applies.
- `QMALLOC_OPTIONS=help=1 prog` prints this list with the values in force and
  ends `prog` with status 0 before its `main`. The manual page `qmalloc(3)`
  is generated from the same table.

| option | default | range | meaning |
|---|---|---|---|
"""

TAIL = """
More on what the options steer: [detection.md](detection.md) (the checks
and reports), [design.md](design.md) (the quarantine, the belt, the
strategies), [deploying.md](deploying.md) (where options are set in a
service or a container).
"""

ENTRY = re.compile(
    r'QM_OPT\(\s*(\w+)\s*,\s*(\w+)\s*,\s*([^,]+?)\s*,\s*([^,]+?)\s*,\s*([^,]+?)\s*,'
    r'\s*(NULL|"(?:[^"\\]|\\.)*")\s*,\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\)', re.S)
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def unquote(s):
    return re.sub(r'\\(.)', r'\1', s)


def number(text, name):
    try:
        return int(text, 0)
    except ValueError:
        sys.exit(f"options.def: {name}: '{text}' is not a number this generator can read")


def cell(s):
    return s.replace('|', '\\|')


def row(m):
    name, kind, dflt, lo, hi, choices, doc = m.groups()
    dflt, lo, hi = number(dflt, name), number(lo, name), number(hi, name)
    doc = ''.join(unquote(s) for s in STRING.findall(doc))
    if kind == 'BOOL':
        d, r = str(dflt), '0 or 1'
    elif kind == 'UINT':
        d, r = str(dflt), f'{lo} to {hi}'
    elif kind == 'ENUM':
        names = unquote(choices[1:-1]).split('|')
        if not 0 <= dflt < len(names) or hi != len(names) - 1:
            sys.exit(f"options.def: {name}: default or range does not fit its choices")
        d, r = f'`{names[dflt]}`', ', '.join(f'`{c}`' for c in names)
    elif kind == 'STR':
        d, r = '(empty)', f'up to {hi} bytes, no `:`'
    else:
        sys.exit(f"options.def: {name}: unknown kind {kind}")
    return f'| `{name}` | {d} | {r} | {cell(doc)} |\n'


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, 'src', 'platform', 'options.def')
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, 'docs', 'options.md')
    with open(src) as f:
        text = re.sub(r'/\*.*?\*/', '', f.read(), flags=re.S)  # the comments
    rows = [row(m) for m in ENTRY.finditer(text)]
    if len(rows) != text.count('QM_OPT('):
        sys.exit(f"{src}: read {len(rows)} of {text.count('QM_OPT(')} QM_OPT entries")
    page = HEAD + ''.join(rows) + TAIL
    if out == '-':
        sys.stdout.write(page)
    else:
        with open(out, 'w') as f:
            f.write(page)


main()
