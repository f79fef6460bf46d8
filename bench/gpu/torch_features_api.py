"""Workers of bench/gpu/torch_features.py: the cases about the allocator's
API and contract (OOM, CUDA IPC, MemPool, the contract checks, 100 streams,
captures racing MemPool releases, a late install). Split from
torch_features.py (files stay small)."""
import ctypes
import os
import time

from torch_features_cases import _nofrag_stats, setup


def case_oom(torch, alloc):
    held, caught = [], None
    try:
        for _ in range(1000):
            held.append(torch.empty(8 << 30, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as e:
        caught = ("torch.OutOfMemoryError", str(e)[:400])
    except RuntimeError as e:
        caught = (f"RuntimeError (not OutOfMemoryError): {type(e).__name__}", str(e)[:400])
    n = len(held)
    del held
    torch.cuda.empty_cache()
    m = torch.nn.Linear(512, 512).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    for _ in range(5):
        loss = m(torch.randn(64, 512, device="cuda")).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    return {"pass": bool(caught and caught[0] == "torch.OutOfMemoryError"), "caught": caught, "held_8GiB": n,
            "trained_after": True}


def _ipc_child(q_in, q_out, alloc):
    setup(alloc)
    import torch
    t = q_in.get()
    t += 1  # visible to the parent
    torch.cuda.synchronize()
    mine = torch.full((1 << 20,), 7.0, device="cuda")
    q_out.put(mine)
    q_in.get()  # parent done reading
    del t, mine


def case_ipc(torch, alloc):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    t = torch.zeros(1 << 20, device="cuda")
    p = ctx.Process(target=_ipc_child, args=(q_in, q_out, alloc))
    p.start()
    q_in.put(t)
    theirs = None
    for _ in range(120):  # a child that died (e.g. its import of the handle failed) ends the wait
        try:
            theirs = q_out.get(timeout=0.5)
            break
        except Exception:  # noqa: BLE001 - queue.Empty
            if not p.is_alive():
                break
    if theirs is None:
        p.join(5)
        return {"pass": False, "child_rc": p.exitcode, "error": "the child sent nothing back (its log is above)"}
    torch.cuda.synchronize()
    seen_child_write = bool((t == 1).all())
    seen_child_tensor = bool((theirs == 7).all())
    del theirs
    q_in.put(None)
    p.join(60)
    del t
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()  # frees what the child has released
    res = {"child_write_seen": seen_child_write, "child_tensor_seen": seen_child_tensor, "child_rc": p.exitcode}
    if alloc.startswith("nofrag"):
        res["live_after"] = _nofrag_stats()["live"]
    # Sharing one block again and again (a tensor sent to many workers) must
    # not open new fds each time (nofrag exports granules as fds). Last: shares
    # nobody receives keep the block alive (PyTorch's IPC ref counter).
    u = torch.zeros(1 << 20, device="cuda")
    fd0 = len(os.listdir("/proc/self/fd"))
    for _ in range(200):
        u.untyped_storage()._share_cuda_()
    fds_grown = res["fds_grown_by_200_shares"] = len(os.listdir("/proc/self/fd")) - fd0
    res["pass"] = (seen_child_write and seen_child_tensor and p.exitcode == 0 and not res.get("live_after")
                   and fds_grown < 8)
    return res


def case_mempool(torch, alloc):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    b = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    segs = pool.snapshot()
    if isinstance(segs, dict):
        segs = segs.get("segments", [])

    def inside(t):
        return any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in segs)
    res = {"in_pool": inside(a), "outside_not_in_pool": not inside(b), "use_count": pool.use_count()}
    del a
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    del pool
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    res.update(reserved_before=before, reserved_after=after, freed=before - after)
    res["pass"] = res["in_pool"] and res["outside_not_in_pool"] and before - after >= (64 << 20)
    del b
    return res


def case_contract(torch, alloc):
    """PyTorch allocator contract points the adapter got wrong once (session 17's audit): a graph
    captured into a MemPool outlives it; fraction 0 refuses; a bad raw_delete raises; a pool's 65th
    distinct stream raises RuntimeError, never OutOfMemoryError, and a record_stream it cannot take
    raises instead of being dropped."""
    import gc
    res = {}
    # 1. ~MemPool calls releasePool then emptyCache(id) while the graph still holds the pool.
    n = 1 << 20
    x = torch.ones(n, device="cuda")
    pool = torch.cuda.MemPool()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            y = (x * 2 + 1).sin() + 1
    torch.cuda.current_stream().wait_stream(s)
    del y
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool.id):
        tmp = x * 2 + 1
        out = tmp.sin() + 1
        del tmp
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    x.fill_(2.0)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    res["graph_outlives_mempool"] = bool(torch.allclose(out, (x * 2 + 1).sin() + 1))
    del g, out
    # 2. A fraction of 0: a request that needs new memory fails with OutOfMemoryError (PyTorch's
    #    allocator still serves what it has cached; nofrag refuses every request).
    ooms0 = torch.cuda.memory_stats().get("num_ooms", 0)
    torch.cuda.set_per_process_memory_fraction(0.0)
    try:
        torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        res["fraction0"] = "allocated"
    except torch.OutOfMemoryError:
        res["fraction0"] = "OutOfMemoryError"
    except RuntimeError as e:
        res["fraction0"] = f"RuntimeError: {str(e)[:200]}"
    torch.cuda.set_per_process_memory_fraction(1.0)
    res["num_ooms_counted"] = torch.cuda.memory_stats().get("num_ooms", 0) - ooms0  # PyTorch counts the refusal
    torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    # 3. raw_delete of a pointer that is no block.
    try:
        torch.cuda.caching_allocator_delete(x.data_ptr() + 512)
        res["bad_delete"] = "no error"
    except RuntimeError as e:
        res["bad_delete"] = "RuntimeError"
    torch.cuda.synchronize()
    # 4. Many distinct streams: PyTorch's pools (32 per priority) plus the default one.
    streams = [torch.cuda.current_stream()] + [torch.cuda.Stream(priority=p) for p in (0, -1) for _ in range(32)]
    res["distinct_streams"] = len({st.cuda_stream for st in streams})
    t = torch.empty(4096, device="cuda")
    rec = "ok"
    for i, st in enumerate(streams):
        try:
            t.record_stream(st)
        except torch.OutOfMemoryError as e:
            rec = f"OutOfMemoryError at stream {i}"
            break
        except RuntimeError as e:
            rec = f"RuntimeError at stream {i}: {str(e)[:160]}"
            break
    res["record_stream"] = rec
    del t
    # 5. record_stream on memory the allocator did not make (a tensor over cudaMalloc'ed memory through
    #    __cuda_array_interface__, as CuPy's): PyTorch's allocator ignores it; it must not raise.
    cudart, ptr = _cudart(), ctypes.c_void_p()
    if cudart.cudaMalloc(ctypes.byref(ptr), 1 << 20) == 0:
        class Foreign:
            __cuda_array_interface__ = {"shape": (1 << 18,), "typestr": "<f4", "data": (ptr.value, False),
                                        "version": 3, "strides": None}
        try:
            ft = torch.as_tensor(Foreign(), device="cuda")
            ft.record_stream(torch.cuda.Stream())
            res["record_stream_foreign"] = "ok"
        except RuntimeError as e:
            res["record_stream_foreign"] = f"RuntimeError: {str(e)[:160]}"
        del ft
        torch.cuda.synchronize()
        cudart.cudaFree(ptr)
    else:
        res["record_stream_foreign"] = "cudaMalloc failed"
    held, alloc_err = [], "ok"
    for i, st in enumerate(streams):
        try:
            with torch.cuda.stream(st):
                held.append(torch.empty(4096, device="cuda"))
        except torch.OutOfMemoryError as e:
            alloc_err = f"OutOfMemoryError at stream {i}: {str(e)[:160]}"
            break
        except RuntimeError as e:
            alloc_err = f"RuntimeError at stream {i}: {str(e)[:160]}"
            break
    res["alloc_per_stream"] = alloc_err
    del held
    torch.cuda.synchronize()
    res["pass"] = (res["graph_outlives_mempool"] and res["fraction0"] == "OutOfMemoryError"
                   and res["bad_delete"] == "RuntimeError" and not rec.startswith("OutOfMemoryError")
                   and not alloc_err.startswith("OutOfMemoryError") and res["record_stream_foreign"] == "ok"
                   and res["num_ooms_counted"] >= 1)
    return res


def _cudart():
    import ctypes
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    raise RuntimeError("libcudart not found")


def case_streams(torch, alloc):
    """100 raw streams (torch.cuda.ExternalStream; PyTorch's own pool has 32 per
    priority) each fill a 4 MiB tensor that stays live: more streams hold live
    blocks than nofrag's 64 slots. Then each tensor gets 20 more fills queued
    and is dropped with them in flight, and a tensor of the same size is made
    on another of the streams and filled once: it must read its own value
    (the new stream ordered after the old one's queued work)."""
    import ctypes
    lib = _cudart()
    streams = []
    for _ in range(100):
        h = ctypes.c_void_p()
        rc = lib.cudaStreamCreateWithFlags(ctypes.byref(h), 1)  # non-blocking
        if rc != 0:
            raise RuntimeError(f"cudaStreamCreateWithFlags: {rc}")
        streams.append(torch.cuda.ExternalStream(h.value))
    n = 1 << 20
    xs = []
    for i, s in enumerate(streams):
        with torch.cuda.stream(s):
            x = torch.empty(n, device="cuda")
            for k in range(20):
                x.fill_(-1.0 - k)
            x.fill_(float(i))
        xs.append(x)
    ys = []
    for i, s in enumerate(streams):
        with torch.cuda.stream(s):
            for k in range(20):
                xs[i].fill_(-100.0 - k)
        xs[i] = None  # freed with its fills queued on s
        with torch.cuda.stream(streams[(i + 37) % 100]):
            y = torch.empty(n, device="cuda")
            y.fill_(1000.0 + i)
        ys.append(y)
    torch.cuda.synchronize()
    wrong = sum(1 for i, y in enumerate(ys) if not bool((y == 1000.0 + i).all()))
    res = {"streams": 100, "wrong": wrong}
    if alloc.startswith("nofrag") and not alloc.startswith("nofrag-ctypes"):
        res["calls"] = {k: v for k, v in _nofrag_stats()["calls"].items() if "event" in k or "stream" in k}
    del ys
    torch.cuda.synchronize()
    if wrong:
        raise AssertionError(f"{wrong} of 100 tensors did not read their value")
    return res  # the streams stay: a pool may record on a stream it knows until it is destroyed


def case_capture_race(torch, alloc, seconds=20.0):
    """One thread captures CUDA graphs (torch.cuda.graph's default, global
    capture mode) back to back while another makes a MemPool, allocates in it
    on its own stream and drops it, over and over: the last release of a pool
    waits for the device, which a capture under way in any thread forbids
    (the wait fails and the capture is invalidated). The release must wait
    before a capture begins, or be put off to the end of the captures; no
    capture may break. PyTorch's own allocator is run for reference: its
    pool segments come from cudaMalloc / cudaFree, also forbidden then (its
    docs say: capture_error_mode="thread_local" for such programs)."""
    import threading
    x = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    stop = threading.Event()
    errs, releases = [], [0]

    def releaser():
        s = torch.cuda.Stream()
        try:
            with torch.cuda.stream(s):
                while not stop.is_set():
                    pool = torch.cuda.MemPool()
                    with torch.cuda.use_mem_pool(pool):
                        t = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
                    del t
                    del pool
                    releases[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errs.append(f"{type(e).__name__}: {e}"[:1200])
    th = threading.Thread(target=releaser, daemon=True)
    th.start()
    captures = broken = wrong = 0
    first = None
    end = time.time() + seconds
    while time.time() < end and th.is_alive():
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                y = x * 2 + 1
            g.replay()
            torch.cuda.synchronize()
            wrong += not bool((y == 3).all())
        except RuntimeError as e:
            broken += 1
            first = first or f"{e}"[:1200]
        del g
        captures += 1
    stop.set()
    th.join(timeout=30)
    res = {"captures": captures, "broken": broken, "wrong": wrong, "pool_releases": releases[0],
           "releaser_errors": len(errs), "first_break": first, "first_releaser_error": errs[0] if errs else None}
    res["pass"] = captures >= 50 and releases[0] >= 50 and not broken and not wrong and not errs
    return res


def case_late_install(torch, alloc):
    """The adapter installed after CUDA is initialised (run under the native
    allocator): PyTorch refuses the swap (changeCurrentAllocator throws after
    the adapter's allocator was made, whose constructor turned the plug-in's
    raising off). The install must fail with PyTorch's reason, leave the
    plug-in's raising as it was (the ctypes path needs it on), and PyTorch's
    own allocator must go on serving."""
    from nofrag import _lib, torch_adapter
    n = 1 << 20
    x = torch.ones(n, device="cuda")  # CUDA initialised: PyTorch's allocator is in use
    lib = _lib.load()
    before = lib.nf_torch_set_throw(1)  # read it (and set it on, the default)
    ok, why = torch_adapter.install()
    after = lib.nf_torch_set_throw(before)
    y = torch.ones(n, device="cuda")
    serves = float((x + y).sum().item()) == 2.0 * n
    return {"install_ok": ok, "why": why[:240], "raising_before": 1, "raising_after": after,
            "native_serves": serves, "pass": (not ok) and after == 1 and serves}
