#!/usr/bin/env python3
"""Import circles between the files of each crate, one line per circle (none: no output).

    python3 scripts/import-circles.py      # from the repository's root

A file imports another when its code (not its comments) names a path into it
(`crate::a::b`, `super::x`), re-exports included.
"""
import re, sys, pathlib, itertools
def modpath(src, f):
    rel = f.relative_to(src).with_suffix('')
    parts = list(rel.parts)
    if parts[-1] in ('lib', 'main', 'mod'): parts = parts[:-1]
    return tuple(parts)
for crate in sorted(pathlib.Path('crates').iterdir()):
    src = crate / 'src'
    if not src.exists(): continue
    files = {modpath(src, f): f for f in src.rglob('*.rs')}
    edges = {m: set() for m in files}
    for m, f in files.items():
        text = "\n".join(l for l in f.read_text().splitlines() if not l.lstrip().startswith("//"))
        # strip test modules roughly
        cut = text.find('#[cfg(test)]\nmod tests')
        if cut >= 0: text = text[:cut]
        for path in re.findall(r'\b((?:crate|super)(?:::\w+)+)', text):
            segs = path.split('::')
            if segs[0] == 'crate': base = ()
            else:
                is_mod = f.stem == 'mod' or f.stem in ('lib', 'main')
                base = m if is_mod else m[:-1]
                while segs and segs[0] == 'super':
                    base = base[:-1]; segs = segs[1:]
                segs = ['x'] + segs
            rest = segs[1:]
            # longest prefix that is a file module
            target = None
            for k in range(len(rest), -1, -1):
                cand = base + tuple(rest[:k])
                if cand in files: target = cand; break
            if target is not None and target != m and target != ():
                edges[m].add(target)
    # find cycles via Tarjan SCC
    index = {}; low = {}; stack = []; on = set(); sccs = []; counter = [0]
    sys.setrecursionlimit(10000)
    def strong(v):
        index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index: strong(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: sccs.append(comp)
    for v in edges:
        if v not in index: strong(v)
    for c in sccs:
        # skip parent<->child (mod.rs re-exporting children) cycles? report all
        print(crate.name, ' <-> '.join('/'.join(x) for x in c))
