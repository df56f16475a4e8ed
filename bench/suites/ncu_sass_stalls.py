#!/usr/bin/env python3
# Per-instruction stall ledger of an ncu source page exported as CSV (ncu -i REP --page source --csv
# --print-source sass > F): per kernel the sample total, the stall reasons over 1 %, the executed
# instruction mix by opcode, and the TOP instructions by samples with their two largest reasons.
#   bench/suites/ncu_sass_stalls.py F.sass.csv [TOP]
import csv,sys,collections
f=sys.argv[1]; top=int(sys.argv[2]) if len(sys.argv)>2 else 30
rows=list(csv.reader(open(f)))
kernels=[];cur=None
for r in rows:
    if r and r[0]=='Kernel Name': cur={'name':r[1],'hdr':None,'ins':[]}; kernels.append(cur); continue
    if cur is None or not r: continue
    if r[0]=='Address': cur['hdr']=r; continue
    cur['ins'].append(r)
for k in kernels:
    h=k['hdr']; idx={n:i for i,n in enumerate(h)}
    ins=k['ins']
    tot=sum(int(r[idx['Warp Stall Sampling (All Samples)']] or 0) for r in ins)
    ex=sum(int(r[idx['Instructions Executed']] or 0) for r in ins)
    print('==',k['name'][:110]); print('samples',tot,'instr executed (warp)',ex,'sass lines',len(ins))
    reasons=[n for n in h if n.startswith('stall_') and '(Not' not in n]
    agg={n:sum(int(r[idx[n]] or 0) for r in ins) for n in reasons}
    print('stalls:', ', '.join(f'{n[6:]} {v*100/tot:.1f}%' for n,v in sorted(agg.items(),key=lambda x:-x[1]) if v*100/tot>=1))
    # opcode histogram weighted by executed
    op=collections.Counter()
    for r in ins:
        o=r[1].split()[0] if r[1].split() else ''
        if o.startswith('@'): o=r[1].split()[1]
        op[o.split('.')[0]]+=int(r[idx['Instructions Executed']] or 0)
    print('exec by opcode:', ', '.join(f'{o} {v*100/ex:.1f}%' for o,v in op.most_common(14)))
    srt=sorted(range(len(ins)),key=lambda i:-int(ins[i][idx['Warp Stall Sampling (All Samples)']] or 0))[:top]
    for i in sorted(srt):
        r=ins[i]; s=int(r[idx['Warp Stall Sampling (All Samples)']] or 0)
        det=sorted(((n[6:],int(r[idx[n]] or 0)) for n in reasons),key=lambda x:-x[1])[:2]
        print(f'{i:5d} {s*100/tot:5.1f}% ex={r[idx["Instructions Executed"]]:>8} {r[1].strip()[:70]:70s} {det}')
