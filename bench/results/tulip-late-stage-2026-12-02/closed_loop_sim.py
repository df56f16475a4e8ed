#!/usr/bin/env python3
# Closed-loop model of the embedding scheduler: C clients, batch-1 512-token requests; the GPU runs
# batches one after another, T(n) = F + P*n ms (H200 2026-11-30: F = 0.94, P = 1.016); h = the hop
# from an answer to the next request reaching tulip. Policies: "now" = immediate staging (cap 2 or
# 1), "late" = the staged batch formed `lead` ms before the running one ends. python3 closed_loop_sim.py
# closed-loop sim: C clients, batch-1 512-token requests; GPU T(n)=F+P*n (FIFO), cap in flight,
# hop h between completion and the client's next arrival at tulip (+ jitter), dispatch delay d.
import heapq, random, statistics, sys
def sim(C, policy, F=0.94, P=1.016, h=0.7, jit=0.3, lead=0.5, cap=2, dur=20000.0, seed=1):
    random.seed(seed)
    ev=[]; seq=0
    def push(t,kind,data=None):
        nonlocal seq; seq+=1; heapq.heappush(ev,(t,seq,kind,data))
    queue=[]  # arrival times
    inflight=[]  # list of (start_pred, end, reqs)
    gpu_free=0.0
    lat=[]; sizes=[]
    for c in range(C): push(random.random()*0.5,'arr')
    pending_release=None
    def dispatch(t):
        nonlocal gpu_free
        reqs=queue[:]; queue.clear()
        start=max(t+0.05,gpu_free); end=start+F+P*len(reqs); gpu_free=end
        inflight.append((start,end,reqs)); sizes.append(len(reqs))
        push(end+0.05,'done',reqs)
    def maybe(t):
        nonlocal pending_release
        if not queue: return
        if len(inflight)==0: dispatch(t); return
        if len(inflight)>=cap: return
        if policy=='now': dispatch(t); return
        if policy=='late':
            rel=inflight[-1][1]-lead
            if t>=rel: dispatch(t)
            elif pending_release is None or pending_release>rel:
                pending_release=rel; push(rel,'tick')
    while ev:
        t,_,k,d=heapq.heappop(ev)
        if t>dur: break
        if k=='arr': queue.append(t); maybe(t)
        elif k=='tick': pending_release=None; maybe(t)
        elif k=='done':
            inflight.pop(0)
            for a in d:
                lat.append(t-a); push(t+h+random.random()*jit,'arr')
            maybe(t)
    n=len(lat); lat.sort()
    return lat[n//2], lat[int(n*.99)], n/dur*1000, statistics.mean(sizes)
for C in (1,2,4,8,16):
    row=[]
    for pol,cap in (('now',2),('now',1),('late',2)):
        p50,p99,tp,bs=sim(C,pol,cap=cap)
        row.append(f"{pol}{cap}: {p50:5.2f}/{p99:5.2f} ms {tp:4.0f}/s b{bs:4.1f}")
    print(C, ' | '.join(row))
