#!/usr/bin/env python3
"""house.py SRC ARCH_DOC: the house rules of src/, as docs/architecture.md
states them: every file in a layer folder of the order src/README.md gives
(lowest first), each folder with its README; an #include never reaches a
higher layer; no circle among the files (a file and its header are one
node, and an internal header x_int.h or x_state.h is one with x); no file
over 700 lines; the architecture page names every file of src/ and none
that does not exist. Prints each breach, exits 1."""
import os
import re
import sys

LIMIT = 700


def main():
    src, doc = sys.argv[1], sys.argv[2]
    bad = []
    order = re.findall(r'^\d+\. `([a-z]+)/`', open(os.path.join(src, 'README.md')).read(), re.M)
    if not order:
        sys.exit('src/README.md lists no layers ("1. `name/`" lines)')
    rank = {name: i for i, name in enumerate(order)}
    files = {}  # basename -> (layer, path)
    for dirpath, _, names in os.walk(src):
        for n in names:
            if not n.endswith(('.c', '.h', '.def')):
                continue
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, src)
            layer = rel.split(os.sep)[0] if os.sep in rel else None
            if layer not in rank:
                bad.append(f'{rel}: in no layer folder of src/README.md')
                continue
            if n in files:
                bad.append(f'{rel}: a second file named {n} (includes are by bare name)')
            files[n] = (layer, path)
    for layer in order:
        if not os.path.isfile(os.path.join(src, layer, 'README.md')):
            bad.append(f'{layer}/: no README.md')
    stems = {re.sub(r'\.(c|h|def)$', '', n) for n in files}

    def node(n):
        # a file and its header are one node, and so is an internal header
        # (x_int.h, x_state.h) with the x it serves
        stem = re.sub(r'\.(c|h|def)$', '', n)
        base = re.sub(r'_(int|state)$', '', stem)
        return base if base in stems else stem

    edges = {}
    for n, (layer, path) in sorted(files.items()):
        text = open(path).read()
        lines = text.count('\n')
        if lines > LIMIT:
            bad.append(f'{os.path.relpath(path, src)}: {lines} lines, over {LIMIT}')
        for inc in re.findall(r'^#include "([^"]+)"', text, re.M):
            if inc not in files:
                continue  # the public header, or a system one
            to = files[inc][0]
            if rank[to] > rank[layer]:
                bad.append(f'{os.path.relpath(path, src)} includes {inc}: {layer}/ may not reach up to {to}/')
            if node(inc) != node(n):
                edges.setdefault(node(n), set()).add(node(inc))
    # circles: strongly connected components of more than one node
    index, low, stack, on, comps = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    for comp in comps:
        bad.append('a circle of files that include each other: ' + ', '.join(comp))
    text = open(doc).read()
    named = set(re.findall(r'src/[a-z]+/[A-Za-z0-9_]+\.(?:c|h|def)\b', text))
    have = {os.path.relpath(p, os.path.dirname(src.rstrip('/'))) for _, p in files.values()}
    for p in sorted(named - have):
        bad.append(f'{os.path.basename(doc)} names {p}, which does not exist')
    for p in sorted(have - named):
        bad.append(f'{os.path.basename(doc)} does not name {p}')
    for b in bad:
        print(b)
    print(f'{len(files)} files in {len(order)} layers, {sum(map(len, edges.values()))} includes: '
          f'{len(bad)} breaches')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
