#!/usr/bin/env python3
"""No circle of imports between modules, of any length (docs/ARCHITECTURE.md, "Arrows
point down").

For each crate's src/ given, every module (a file, or an inline `mod name { … }`) is a
node, and every path it names is an edge to the longest module that path resolves to:
`use` declarations (braced groups expanded, nested), and paths written inline in code
(`crate::a::b`, `super::x`, `self::x`, and a sibling named by its bare name after a
`use super::…` is not needed: bare names resolve only through `use`). Only `mod tests`
(inline or as a file) is skipped, and comments and string literals are ignored.

A module may name its ancestors without making a circle (they declare it: a child
reading its parent's types is how Rust modules are built); every other edge counts.
The strongly connected components of that graph (Tarjan) with more than one module are
printed with one circle through them, and the exit status is 1.

Usage: scripts/module-cycles.py host/src egress/src …   (prints "no module cycles in N
crates (M modules)" when clean)"""
import os
import re
import sys


def strip(src):
    """The source without comments, string and char literals (kept as blanks)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            i = n if j < 0 else j
        elif src.startswith('/*', i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith('/*', i):
                    depth, i = depth + 1, i + 2
                elif src.startswith('*/', i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == 'r' and re.match(r'r#*"', src[i:i + 20]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == '_')):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == '\\' else 1
            i = j + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", src[i:i + 12]):
            m = re.match(r"'(\\.[^']*|[^\\'])'", src[i:])
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def block_end(src, open_brace):
    """The index just past the `}` matching the `{` at open_brace."""
    depth = 0
    for i in range(open_brace, len(src)):
        if src[i] == '{':
            depth += 1
        elif src[i] == '}':
            depth -= 1
            if depth == 0:
                return i + 1
    return len(src)


MOD = re.compile(r'(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_0-9]+)\s*([{;])')


def split_modules(path, src):
    """[(module path segments, source text)] for a file and its inline modules, less
    `mod tests`; plus the names of file modules it declares."""
    pieces, declared = [], []

    def walk(segs, text):
        own, pos = [], 0
        for m in MOD.finditer(text):
            if m.start() < pos:
                continue
            name, kind = m.group(1), m.group(2)
            if kind == ';':
                if name != 'tests':
                    declared.append(segs + [name])
                continue
            end = block_end(text, m.end() - 1)
            own.append(text[pos:m.start()])
            pos = end
            if name != 'tests':
                walk(segs + [name], text[m.end():end - 1])
        own.append(text[pos:])
        pieces.append((segs, ''.join(own)))

    walk([], src)
    return pieces, declared


def expand_use(tree, prefix=''):
    """The paths of a `use` tree (`a::{b, c::{d, e as f}, self}` → a::b, a::c::d, …)."""
    tree = tree.strip()
    if not tree:
        return []
    brace = tree.find('{')
    if brace < 0:
        item = tree.split(' as ')[0].strip()
        if item == 'self':
            return [prefix.rstrip(':')]
        return [prefix + item]
    head = tree[:brace]
    inner = tree[brace + 1:tree.rfind('}')]
    parts, depth, cur = [], 0, ''
    for ch in inner:
        if ch == ',' and depth == 0:
            parts.append(cur)
            cur = ''
            continue
        depth += ch == '{'
        depth -= ch == '}'
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        out += expand_use(p, prefix + head)
    return out


def crate_graph(root):
    mods, texts = set(), {}
    for dp, _dn, fn in os.walk(root):
        for f in fn:
            if not f.endswith('.rs'):
                continue
            p = os.path.join(dp, f)
            segs = os.path.relpath(p, root)[:-3].split('/')
            if segs[-1] == 'mod':
                segs = segs[:-1]
            if segs in (['lib'], ['main']):
                segs = []
            if 'tests' in segs:
                continue
            pieces, _ = split_modules(p, strip(open(p, encoding='utf-8').read()))
            for inner, text in pieces:
                key = tuple(segs + inner)
                mods.add(key)
                texts[key] = texts.get(key, '') + '\n' + text

    def resolve(segs):
        for k in range(len(segs), -1, -1):
            if tuple(segs[:k]) in mods:
                return tuple(segs[:k])
        return None

    def absolute(here, path):
        segs = path.split('::')
        if segs[0] == 'crate':
            return segs[1:]
        base = list(here)
        while segs and segs[0] in ('super', 'self'):
            if segs.pop(0) == 'super':
                base = base[:-1]
        return base + segs if segs is not None else base

    edges = {m: set() for m in mods}
    for m, text in texts.items():
        paths = []
        for u in re.finditer(r'\buse\s+([^;]*);', text):
            tree = u.group(1)
            if re.match(r'\s*(crate|super|self)\b', tree):
                paths += expand_use(tree)
        for p in re.finditer(r'\b((?:crate|super|self)(?:::[A-Za-z_0-9]+)+)', text):
            paths.append(p.group(1))
        for path in paths:
            target = resolve(absolute(m, path))
            if target is None or target == m:
                continue
            if m[:len(target)] == target:  # an ancestor: it declares m
                continue
            edges[m].add(target)
    return mods, edges


def sccs(nodes, edges):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
            out.append(comp)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def circle(comp, edges):
    """One circle through the component's first module (breadth-first back to it)."""
    members = set(comp)
    start = min(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & members):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def name(m):
    return '::'.join(m) or 'crate'


def main(roots):
    found, total = False, 0
    for root in roots:
        mods, edges = crate_graph(root)
        total += len(mods)
        for comp in sccs(mods, edges):
            found = True
            print(f'{root}: a circle of {len(comp)} modules: '
                  + ' -> '.join(name(m) for m in circle(comp, edges)))
    if not found:
        print(f'no module cycles in {len(roots)} crates ({total} modules)')
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
