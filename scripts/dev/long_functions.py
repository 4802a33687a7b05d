#!/usr/bin/env python3
"""Lists the Rust functions longer than a limit (issue 40: no function over ~150 lines in src/).

A function's length is its lines from the `fn` line to the closing brace of its body, found by
brace matching on the source with comments, strings and char literals blanked out (so a `{` in a
string or a doc comment does not count). Functions named in the allow-list file (one
`path::name` a line, `#` comments; the ones still pending) are printed but do not fail the run.
Exits 1 when a function not on the list is over the limit, or when a listed one no longer is (so
the list only shrinks). Usage:
    scripts/dev/long_functions.py [--limit N] [--allow FILE] [DIR ...]   (default: 150, src)
"""
import argparse
import os
import re
import sys


def blank(src):
    """`src` with comments and the insides of string and char literals replaced by spaces."""
    out = list(src)
    i, n = 0, len(src)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != '\n':
                out[k] = ' '

    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif src.startswith('/*', i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith('/*', j):
                    depth, j = depth + 1, j + 2
                elif src.startswith('*/', j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif (m := re.match(r'b?r(#*)"', src[i:i + 300])) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == '_')):
            close = '"' + m.group(1)
            j = src.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            wipe(i + m.end(), j - len(close))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == '\\' else 1
            wipe(i + 1, j)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}', b'x') or a lifetime ('a, 'static).
            if i + 1 < n and src[i + 1] == '\\':
                j = src.find("'", i + 2)
                j = n if j < 0 else j
                wipe(i + 1, j)
                i = j + 1
            elif i + 2 < n and src[i + 2] == "'":
                wipe(i + 1, i + 2)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return ''.join(out)


def functions(path):
    """(name, first line, lines) of every function with a body in the file at `path`."""
    src = blank(open(path, encoding='utf-8').read())
    found = []
    for m in re.finditer(r'\bfn\s+([A-Za-z_][A-Za-z0-9_]*)', src):
        depth, j = 0, m.end()
        while j < len(src):
            c = src[j]
            if c in '([':
                depth += 1
            elif c in ')]':
                depth -= 1
            elif depth == 0 and c in '{;':
                break
            j += 1
        if j >= len(src) or src[j] == ';':
            continue  # a declaration without a body (trait method, extern)
        braces, k = 0, j
        while k < len(src):
            if src[k] == '{':
                braces += 1
            elif src[k] == '}':
                braces -= 1
                if braces == 0:
                    break
            k += 1
        first = src.count('\n', 0, m.start()) + 1
        last = src.count('\n', 0, k) + 1
        found.append((m.group(1), first, last - first + 1))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--limit', type=int, default=150)
    ap.add_argument('--allow', default=os.path.join(os.path.dirname(__file__), 'long_functions.allow'))
    ap.add_argument('dirs', nargs='*', default=['src'])
    a = ap.parse_args()
    allowed = set()
    if os.path.exists(a.allow):
        for line in open(a.allow, encoding='utf-8'):
            line = line.split('#', 1)[0].strip()
            if line:
                allowed.add(line)
    over, seen = [], set()
    for d in a.dirs:
        for dp, _, fs in os.walk(d):
            for f in sorted(fs):
                if f.endswith('.rs'):
                    p = os.path.join(dp, f)
                    over += [(p, name, line, lines) for name, line, lines in functions(p) if lines > a.limit]
    bad = 0
    for p, name, line, lines in sorted(over, key=lambda o: -o[3]):
        key = f'{p}::{name}'
        seen.add(key)
        mark = 'allowed (pending)' if key in allowed else 'OVER'
        bad += key not in allowed
        print(f'{lines:5} {p}:{line} {name}  {mark}')
    for key in sorted(allowed - seen):
        print(f'  now under {a.limit}: {key} (remove it from {a.allow})')
        bad += 1
    print(f'{len(over)} function(s) over {a.limit} lines, {bad} not allowed', file=sys.stderr)
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
