#!/usr/bin/env python3
"""No module imports one that imports it back (issue 22): for each crate's src/ given,
every `crate::…` and `super::…` path (braced groups expanded) outside `#[cfg(test)]`
is resolved to the longest module it names; a pair of modules that name each other
(neither the other's parent) is printed, and the exit status is 1.
Usage: scripts/module-cycles.py host/src egress/src …"""
import os, re, sys

found = False
for root in sys.argv[1:]:
    files={}
    for dp,dn,fn in os.walk(root):
        for f in fn:
            if not f.endswith('.rs'): continue
            p=os.path.join(dp,f)
            rel=os.path.relpath(p,root)[:-3]
            parts=rel.split('/')
            if parts[-1]=='mod': parts=parts[:-1]
            if parts in (['lib'],['main']): continue
            files['::'.join(parts)]=p
    mods=set(files)
    def resolve(path):
        segs=path.split('::')
        for n in range(len(segs),0,-1):
            k='::'.join(segs[:n])
            if k in mods: return k
        return None
    edges={m:set() for m in mods}
    for m,p in files.items():
        src=open(p).read().split('#[cfg(test)]')[0]
        src=re.sub(r'//[^\n]*','',src)
        def expand(t):
            out=[]
            for mm in re.finditer(r'\b(crate|(?:super::)*super)::((?:[a-z_0-9]+::)*)\{([^{}]*)\}',t):
                for item in mm.group(3).split(','):
                    item=item.strip().split(' as ')[0]
                    if item and item!='self': out.append(mm.group(1)+'::'+mm.group(2)+item)
                    elif item=='self': out.append(mm.group(1)+'::'+mm.group(2).rstrip(':'))
            return t+'\n'+'\n'.join(out)
        src=expand(src)
        for mm in re.finditer(r'crate::((?:[a-z_0-9]+::)*[a-z_0-9]+)',src):
            r=resolve(mm.group(1))
            if r and r!=m: edges[m].add(r)
        for mm in re.finditer(r'\b((?:super::)+)((?:[a-z_0-9]+::)*[a-z_0-9]+)',src):
            ups=mm.group(1).count('super::')
            base=m.split('::')
            # a mod.rs-file module: super refers to parent of m
            base=base[:len(base)-ups]
            r=resolve('::'.join(base+mm.group(2).split('::')))
            if r and r!=m: edges[m].add(r)
    for a in sorted(mods):
        for b in sorted(edges[a]):
            if a<b and a in edges.get(b,()):
                if b.startswith(a+'::') or a.startswith(b+'::'): continue
                print(f'{root}: {a} <-> {b} import each other')
                found = True

sys.exit(1 if found else 0)
