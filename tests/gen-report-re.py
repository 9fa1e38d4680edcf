#!/usr/bin/env python3
# gen-report-re.py REPORT_RE OUT: writes the C header of report.re's
# regexes, one macro each: NAME as a string literal, or NAME(X, ...) for a
# template whose @X@ placeholders become its arguments (string literals
# concatenated in). Anything but NAME='ERE' lines, comments and blank
# lines is an error, so that the file cannot hold what the tests miss.
import re
import sys

src, out = sys.argv[1], sys.argv[2]
lines = ['// Generated from tests/report.re by tests/gen-report-re.py: edit that file.',
         '#ifndef QM_TEST_REPORT_FORMAT_H', '#define QM_TEST_REPORT_FORMAT_H']
for n, line in enumerate(open(src, encoding='utf-8'), 1):
    line = line.rstrip('\n')
    if not line.strip() or line.startswith('#'):
        continue
    m = re.fullmatch(r"([A-Z][A-Z0-9_]*)='([^']*)'", line)
    if not m:
        sys.exit(f'{src}:{n}: not NAME=\'ERE\': {line}')
    name, value = m.groups()
    parts = value.split('@')
    if len(parts) % 2 == 0:
        sys.exit(f'{src}:{n}: unpaired @ in {name}')
    params, body = [], []
    for i, p in enumerate(parts):
        if i % 2:
            if p not in params:
                params.append(p)
            body.append(p)
        elif p:
            body.append('"' + p.replace('\\', '\\\\').replace('"', '\\"') + '"')
    head = name + ('(' + ', '.join(params) + ')' if params else '')
    lines.append(f'#define {head} {" ".join(body) or chr(34) * 2}')
lines.append('#endif')
open(out, 'w', encoding='utf-8').write('\n'.join(lines) + '\n')
