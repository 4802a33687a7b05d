#!/usr/bin/env python3
"""Counts circular dependencies between the modules of src/ (issue 40's review metric).

Two levels: the top-level modules (`crate::X` references between src/X and src/Y), and the
submodules inside each folder ("rooms": `super::X` and `crate::room::X`). A circle is a strongly
connected component of more than one module. Comment lines and `#[cfg(test)] mod tests` are left
out, so doc links do not count. Usage: scripts/dev/module_circles.py [SRC_DIR]
"""
import os
import re
import sys
root=sys.argv[1] if len(sys.argv) > 1 else 'src'
def strip(src):
    src=re.sub(r'#\[cfg\(test\)\]\s*mod tests\s*\{.*','',src,flags=re.S)
    return '\n'.join(l for l in src.split('\n') if not l.strip().startswith('//'))
def scc(nodes,edges):
    idx={};low={};st=[];on=set();out=[];c=[0]
    def sc(v):
        idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
        for w in edges.get(v,()):
            if w not in idx: sc(w);low[v]=min(low[v],low[w])
            elif w in on: low[v]=min(low[v],idx[w])
        if low[v]==idx[v]:
            comp=[]
            while True:
                w=st.pop();on.discard(w);comp.append(w)
                if w==v:break
            if len(comp)>1: out.append(sorted(comp))
    for v in sorted(nodes):
        if v not in idx: sc(v)
    return out
top=set(n[:-3] if n.endswith('.rs') else n for n in os.listdir(root) if n not in('lib.rs','main.rs'))
E={}
files=[]
for dp,_,fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'): files.append(os.path.join(dp,f))
def parts(p):
    r=os.path.relpath(p,root)[:-3].split('/')
    return r[:-1] if r[-1]=='mod' else r
for p in files:
    m=parts(p)
    if m[0] in('lib','main'):continue
    s=strip(open(p).read())
    for t in re.findall(r'crate::([a-z_0-9]+)',s):
        if t in top and t!=m[0]: E.setdefault(m[0],set()).add(t)
print('top-level circles:',scc(top,E))
total=len(scc(top,E))
for room in sorted(top):
    d=os.path.join(root,room)
    if not os.path.isdir(d):continue
    subs=set(n[:-3] if n.endswith('.rs') else n for n in os.listdir(d) if n!='mod.rs')
    e={}
    for p in files:
        m=parts(p)
        if m[0]!=room or len(m)<2:continue
        s=strip(open(p).read())
        refs=re.findall(r'crate::'+room+r'::([a-z_0-9]+)',s)
        if len(m)==2: refs+=re.findall(r'super::([a-z_0-9]+)',s)
        else: refs+=re.findall(r'super::super::([a-z_0-9]+)',s)
        for t in refs:
            if t in subs and t!=m[1]: e.setdefault(m[1],set()).add(t)
    c=scc(subs,e)
    if c: print(room,c); total+=len(c)
print('total',total)
