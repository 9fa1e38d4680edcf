#!/usr/bin/env python3
# options-dict.py: writes the libFuzzer dictionary of the options harness from
# src/platform/options.def (every name, choice, and each range's edges), so that the
# dictionary follows the table without being kept by hand.
# usage: options-dict.py OPTIONS_DEF OUT
import re
import sys

words = {"=", ":", "::", "true", "false", "yes", "no", "0", "1"}
for m in re.finditer(r'QM_OPT\((\w+),\s*(\w+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(NULL|"[^"]*")',
                     open(sys.argv[1]).read()):
    name, kind, default, lo, hi, choices = m.groups()
    words |= {name, name + "="}
    if kind == "ENUM":
        words |= set(choices.strip('"').split("|"))
    elif kind == "UINT":
        words |= {default, lo, hi, str(int(hi) + 1)}
        if int(lo) > 0:
            words.add(str(int(lo) - 1))
with open(sys.argv[2], "w") as f:
    for w in sorted(words):
        f.write('"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"\n')
