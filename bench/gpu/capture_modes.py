"""python3 bench/gpu/capture_modes.py OUT.json [VARIANTS]  (docs/benchmarks.md section 29)

Do CUDA VMM driver calls from one thread conflict with a global-mode
stream capture under way in another? Thread A captures torch graphs back to
back (torch.cuda.graph: global mode); thread B runs create / reserve / map /
set-access / unmap / release / free, and (variant) an event record + sync on
its own stream, in its thread's default mode or in relaxed mode
(cuThreadExchangeStreamCaptureMode). Counts every non-zero return code per
call, and A's broken captures. Also times an exchange pair (through ctypes:
bench/gpu/capture_mode_cost.c times it in C). VARIANTS: a comma-separated
subset of default, relaxed, default+events, relaxed+events (a variant that
breaks captures can leave the device unusable for the next: run it last or
alone)."""
import ctypes, json, sys, threading, time
import torch

cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
torch.cuda.init()
class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Flags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Loc),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", Flags)]
class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]

def ctx_current():
    ctx = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0

def exchange(mode):
    m = ctypes.c_int(mode)
    r = cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(m))
    return r, m.value

def run(variant, seconds=6.0):
    torch.cuda.synchronize()
    x = torch.ones(1 << 20, device="cuda")
    stop = threading.Event()
    codes = {}
    ops = [0]
    def note(name, r):
        if r:
            codes[f"{name}:{r}"] = codes.get(f"{name}:{r}", 0) + 1
    def b():
        ctx_current()
        if "relaxed" in variant:
            note("exchange", exchange(2)[0])
        G = 2 << 20
        prop = Prop(); prop.type = 1; prop.location = Loc(1, 0)
        acc = Access(Loc(1, 0), 3)
        s = ctypes.c_void_p(); note("streamcreate", cu.cuStreamCreate(ctypes.byref(s), 1))
        ev = ctypes.c_void_p(); note("eventcreate", cu.cuEventCreate(ctypes.byref(ev), 2))
        while not stop.is_set():
            h = ctypes.c_ulonglong(); va = ctypes.c_ulonglong()
            r = cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(G), ctypes.byref(prop), ctypes.c_ulonglong(0)); note("create", r)
            r2 = cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(G), ctypes.c_size_t(0), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)); note("reserve", r2)
            if r == 0 and r2 == 0:
                note("map", cu.cuMemMap(va, ctypes.c_size_t(G), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0)))
                note("setaccess", cu.cuMemSetAccess(va, ctypes.c_size_t(G), ctypes.byref(acc), ctypes.c_size_t(1)))
                note("unmap", cu.cuMemUnmap(va, ctypes.c_size_t(G)))
            if r == 0: note("release", cu.cuMemRelease(h))
            if r2 == 0: note("free", cu.cuMemAddressFree(va, ctypes.c_size_t(G)))
            if "events" in variant:
                note("record", cu.cuEventRecord(ev, s))
                note("evsync", cu.cuEventSynchronize(ev))
            ops[0] += 1
    th = threading.Thread(target=b, daemon=True); th.start()
    caps = broken = 0; first = None
    end = time.time() + seconds
    while time.time() < end:
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                y = x * 2 + 1
            g.replay(); torch.cuda.synchronize()
        except RuntimeError as e:
            broken += 1; first = first or str(e)[:300]
            try: torch.cuda.synchronize()
            except RuntimeError: pass
        caps += 1
    stop.set(); th.join(10)
    return {"variant": variant, "captures": caps, "broken": broken, "b_iterations": ops[0], "b_errors": codes, "first_break": first}

out = {}
ctx_current()
t0 = time.perf_counter(); n = 100000
for _ in range(n):
    exchange(2); exchange(0)
out["exchange_pair_ns_ctypes"] = (time.perf_counter() - t0) / n * 1e9
for v in (sys.argv[2].split(",") if len(sys.argv) > 2 else ("default", "relaxed", "default+events", "relaxed+events")):
    out[v] = run(v)
    print(json.dumps(out[v]), flush=True)
print(json.dumps({"exchange_pair_ns_ctypes": out["exchange_pair_ns_ctypes"]}))
json.dump(out, open(sys.argv[1], "w"), indent=1)
