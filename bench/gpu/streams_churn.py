#!/usr/bin/env python3
"""Many streams, one after another: the workloads of run 73 that broke the pool
(a CuPy stream per step; PyTorch's 128 pool streams) timed, with the backend
calls they cost. A free block that many streams used carries all of them in its
mask, so reusing it on yet another stream may wait on each (`stream_wait` per
allocation is the figure to watch). One workload and allocator per process:

    python3 bench/gpu/streams_churn.py cupy|torch native|nofrag [ROUNDS]

Prints one JSON line: allocations, whether every result read back right, wall
time per allocation (median of the rounds after the first) and, for nofrag,
the backend calls per allocation.
"""
import json
import statistics
import sys
import time


def cupy_rounds(alloc, rounds):
    import cupy
    pool = None
    if alloc == "nofrag":
        import nofrag.cupy as nfc
        pool = nfc.enable()
    n = 1 << 20  # 4 MiB of float32
    ok, per_round, allocs = True, [], 0
    for r in range(rounds):
        t0 = time.perf_counter()
        for i in range(100):
            with cupy.cuda.Stream(non_blocking=True) as s:
                a = cupy.full(n, float(i % 13), dtype=cupy.float32)
                b = a * 2.0
                v = float(b.sum())
                s.synchronize()
                del a, b
                allocs += 3  # a, b and the sum's result
            ok &= v == 2.0 * (i % 13) * n
        cupy.cuda.Device().synchronize()
        per_round.append((time.perf_counter() - t0) / 100)
    return ok, per_round, allocs, (pool.stats() if pool else None)


def torch_rounds(alloc, rounds):
    if alloc == "nofrag":
        import nofrag.torch as nft
        info = nft.enable()
        if not info.get("adapter"):
            raise SystemExit(f"adapter not installed: {info.get('adapter_error')}")
    import torch
    # PyTorch hands out 32 pool streams per priority, round robin.
    lo, hi = torch.cuda.Stream.priority_range()
    streams = [torch.cuda.Stream(priority=p) for p in range(hi, lo + 1) for _ in range(32)]
    distinct = len({s.cuda_stream for s in streams})
    n = 1 << 20
    ok, per_round, allocs = True, [], 0
    # Results go to one tensor of the default stream: a result kept per
    # stream would leave 128 streams named by live blocks at once (nofrag
    # takes 64: docs/pytorch.md "Streams"). Each stream waits for the zeroing.
    res = torch.zeros(len(streams), device="cuda")
    for r in range(rounds):
        res.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                x = torch.full((n,), float(i % 13), device="cuda")
                res[i] = (x * 2.0).sum()
                del x
                allocs += 3  # x, the product and the sum
        torch.cuda.synchronize()
        per_round.append((time.perf_counter() - t0) / len(streams))
        ok &= all(int(v) == 2 * (i % 13) * n for i, v in enumerate(res.tolist()))
    st = None
    if alloc == "nofrag":
        import nofrag.torch as nft
        st = nft.stats(0)
    return ok, per_round, allocs, st, distinct


def main():
    what, alloc = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    distinct = None
    if what == "cupy":
        ok, per_round, allocs, st = cupy_rounds(alloc, rounds)
        unit = "stream (3 allocations)"
    else:
        ok, per_round, allocs, st, distinct = torch_rounds(alloc, rounds)
        unit = "stream (3 allocations)"
    out = {"workload": what, "alloc": alloc, "rounds": rounds, "allocations": allocs, "results_right": bool(ok),
           "us_per_" + unit.split()[0]: round(statistics.median(per_round[1:] or per_round) * 1e6, 2),
           "us_rounds": [round(t * 1e6, 2) for t in per_round]}
    if distinct is not None:
        out["distinct_streams"] = distinct
    if st:
        calls = st["calls"]
        out["calls_per_alloc"] = {k: round(v / allocs, 2) for k, v in calls.items() if v}
        out["cross_stream_reuses"] = st.get("cross_stream_reuses")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
