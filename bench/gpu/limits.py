#!/usr/bin/env python3
"""What works in PyTorch under the nofrag plug-in: each check is tried and its
behaviour recorded (docs/pytorch.md quotes the outcomes).

    NOFRAG_LIB=build/libnofrag.so PYTHONPATH=python python3 bench/gpu/limits.py --json limits.json

Checks run in order of risk: the ones that may leave the CUDA context broken
(graph capture, IPC) come last, and the JSON is rewritten after every check so
a crash loses only the check that crashed.
"""

import argparse
import json
import os
import sys
import time
import traceback

R = {"checks": {}, "status": "running"}
JSON = None


def save():
    with open(JSON, "w") as f:
        json.dump(R, f, indent=1)


def check(name):
    def deco(fn):
        def run(*a):
            t0 = time.time()
            R["checks"][name] = {"outcome": "running"}
            save()
            try:
                outcome, detail = fn(*a)
            except BaseException as e:
                outcome, detail = "exception", f"{type(e).__name__}: {e}"[:1500]
                R["checks"][name]["traceback"] = traceback.format_exc()[-2000:]
            R["checks"][name].update(outcome=outcome, detail=detail, seconds=round(time.time() - t0, 2))
            print(f"{name}: {outcome}: {str(detail)[:300]}", flush=True)
            save()
        return run
    return deco


@check("install")
def c_install(nft, torch):
    info = nft.install_info()
    return ("ok" if info["enabled"] else "failed"), info


@check("basic_compute")
def c_basic(nft, torch):
    x = torch.randn(4096, 4096, device="cuda")
    y = (x @ x).sum().item()
    z = torch.empty(0, device="cuda")  # empty storage: NULL pointer is fine
    return "ok", f"matmul ok ({y:.3e}); empty tensor data_ptr {z.data_ptr()}"


@check("memory_stats_api")
def c_stats(nft, torch):
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    ms = torch.cuda.memory_stats()
    a, r = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    pa, pr = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    summ = torch.cuda.memory_summary()
    nested = torch.cuda.memory.memory_stats_as_nested_dict()
    ok = a >= (256 << 20) and r >= a and pa >= a and "nofrag" in summ and "allocated_bytes" in nested
    del x
    return ("ok" if ok else "wrong values"), (f"allocated {a}, reserved {r}, max allocated {pa}, max reserved {pr}, "
                                              f"{len(ms)} keys")


@check("empty_cache")
def c_empty(nft, torch):
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    del x
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    import nofrag
    return ("ok" if after < before else "no effect"), (f"reserved {before} -> {after}; mapped now "
                                                       f"{nofrag.stats(0)['mapped']}")


@check("record_stream")
def c_record(nft, torch):
    import nofrag
    s = torch.cuda.Stream()
    x = torch.ones(64 << 20, device="cuda")
    before = nofrag.stats(0)["cross_stream_reuses"]
    with torch.cuda.stream(s):
        for _ in range(50):
            x.mul_(1.0000001)
        x.record_stream(s)
    del x
    y = torch.zeros(64 << 20, device="cuda")  # may reuse x's memory: must wait for s
    y.add_(2)
    torch.cuda.synchronize()
    ok = bool((y == 2).all().item())
    return ("ok" if ok else "data race"), (f"cross_stream_reuses {before} -> "
                                           f"{nofrag.stats(0)['cross_stream_reuses']}")


@check("memory_fraction_and_oom")
def c_oom(nft, torch):
    import nofrag
    torch.cuda.set_per_process_memory_fraction(0.05)
    lim = nofrag.stats(0)["limit"]
    frac = torch.cuda.get_per_process_memory_fraction()
    detail = f"limit at fraction 0.05: {lim} B; get_per_process_memory_fraction -> {frac}; "
    try:
        t = torch.empty(16 << 30, dtype=torch.uint8, device="cuda")
        ptr = t.data_ptr()
        del t  # never touch it: a NULL pointer would fault
        outcome = "returned NULL tensor (no exception)" if ptr == 0 else "allocated beyond the limit"
        detail += f"data_ptr {ptr}"
    except BaseException as e:
        outcome = f"raises {type(e).__name__}"
        detail += str(e)[:400]
    torch.cuda.set_per_process_memory_fraction(1.0)
    z = torch.ones(1 << 20, device="cuda").sum().item()  # still healthy?
    detail += f"; afterwards a new tensor computes {z:.0f}"
    return outcome, detail


@check("cudnn_benchmark")
def c_cudnn(nft, torch):
    torch.backends.cudnn.benchmark = True
    conv = torch.nn.Conv2d(64, 128, 3, padding=1).cuda()
    x = torch.randn(32, 64, 112, 112, device="cuda", requires_grad=True)
    y = conv(x)
    y.sum().backward()
    torch.cuda.synchronize()
    torch.backends.cudnn.benchmark = False
    return "ok", "conv forward+backward with cudnn.benchmark=True ran"


@check("memory_snapshot")
def c_snapshot(nft, torch):
    try:
        torch.cuda.memory._record_memory_history(max_entries=1000)
        rec = "ok"
    except BaseException as e:
        rec = f"{type(e).__name__}: {str(e)[:200]}"
    try:
        snap = torch.cuda.memory._snapshot()
        snp = f"ok ({len(snap.get('segments', []))} segments)"
    except BaseException as e:
        snp = f"{type(e).__name__}: {str(e)[:200]}"
    return ("unsupported" if "support" in rec + snp else "ok"), f"_record_memory_history: {rec}; _snapshot: {snp}"


@check("caching_allocator_alloc")
def c_raw(nft, torch):
    p = torch.cuda.caching_allocator_alloc(1 << 20)
    torch.cuda.caching_allocator_delete(p)
    return "ok", f"raw alloc/delete of 1 MiB at {p:#x}"


@check("cuda_graph_capture")
def c_graph(nft, torch):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    static_in = torch.randn(256, 1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = model(static_in)
    # Allocate and write other tensors between replays: with no private pool,
    # the graph's intermediates may share memory with them.
    junk = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(16)]
    static_in.copy_(torch.randn(256, 1024, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    ref = model(static_in)
    err = (static_out - ref).abs().max().item()
    intact = all(bool((j == 7.0).all().item()) for j in junk)
    ok = err < 1e-3 and intact
    return ("ok" if ok else "wrong results"), f"replay max error {err:.3e}; other tensors intact: {intact}"


def _ipc_child(q):
    t = q.get(timeout=30)
    q.put(float(t.sum().item()))


@check("multiprocessing_cuda_ipc")
def c_ipc(nft, torch):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    t = torch.ones(1 << 20, device="cuda")
    # Pickle here first: Queue.put pickles in a feeder thread, where an error
    # would only be printed. This is the step that calls cudaIpcGetMemHandle.
    from multiprocessing.reduction import ForkingPickler
    try:
        ForkingPickler.dumps(t)
    except BaseException as e:
        return f"share fails: {type(e).__name__}", str(e)[:600]
    p = ctx.Process(target=_ipc_child, args=(q,))
    p.start()
    try:
        q.put(t)
        time.sleep(1)
        got = q.get(timeout=30)
        out = ("ok" if got == float(1 << 20) else "wrong data"), f"child summed {got}"
    finally:
        p.join(timeout=10)
        if p.is_alive():
            p.terminate()
    return out


def main():
    global JSON
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    JSON = a.json
    if a.dry_run:
        R["checks"] = {"install": {"outcome": "ok", "detail": "dry run"}}
        R["status"] = "dry run"
        save()
        return
    save()
    try:
        import nofrag.torch as nft
        nft.enable()
        import torch
    except BaseException as e:
        R["status"] = f"enable failed: {type(e).__name__}: {e}"
        save()
        raise
    R["torch"] = torch.__version__
    try:
        import ctypes
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        R["libc10_torchCheckFail"] = bool(getattr(lib, "_ZN3c106detail14torchCheckFailEPKcS2_jS2_", None))
    except Exception as e:
        R["libc10_torchCheckFail"] = f"{type(e).__name__}: {e}"
    for fn in (c_install, c_basic, c_stats, c_empty, c_record, c_oom, c_cudnn, c_snapshot, c_raw, c_graph, c_ipc):
        fn(nft, torch)
    R["status"] = "done"
    save()


if __name__ == "__main__":
    sys.exit(main())
