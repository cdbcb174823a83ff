#!/usr/bin/env python3
"""Functions of the crates' library code longer than N lines, longest first.

    python3 scripts/long-functions.py 70 crates/*/src

Reads rustfmt'd code: a function's body ends at the first `}` line with the `fn` line's
indentation. Test modules (after `#[cfg(test)]`) and tests/ and benches/ are left out.
"""
import re, sys, pathlib
limit = int(sys.argv[1]); roots = sys.argv[2:]
fn = re.compile(r'^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"[^"]*"\s+)?fn\s+(\w+)')
out = []
for root in roots:
    for p in pathlib.Path(root).rglob('*.rs'):
        if '/tests/' in str(p) or '/benches/' in str(p): continue
        lines = p.read_text().splitlines()
        in_test = None
        for i, l in enumerate(lines):
            if re.match(r'^\s*#\[cfg\(test\)\]', l): in_test = i
            m = fn.match(l)
            if not m: continue
            ind = m.group(1)
            # find end
            for j in range(i, len(lines)):
                if lines[j].rstrip().endswith(';') and j == i: break
                if lines[j] == ind + '}':
                    n = j - i + 1
                    if n > limit and not (in_test is not None and in_test < i):
                        out.append((n, f'{p}:{i+1}', m.group(8)))
                    break
for n, loc, name in sorted(out, reverse=True): print(n, loc, name)
print(len(out), 'functions over', limit)
