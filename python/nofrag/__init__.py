"""nofrag: GPU memory that does not fragment.

A pool of your own (any program; backend "host" needs no GPU):

    with nofrag.Pool("backend:host,limit:256MiB") as pool:
        p = pool.alloc(1 << 20)      # address (int)
        pool.free(p)                 # a second free raises nofrag.NofragError
        pool.stats()

CuPy: ``nofrag.cupy.enable(limit="40GiB")``. PyTorch:

    import nofrag.torch
    nofrag.torch.enable(limit="40GiB")     # before CUDA is initialised
    ...
    nofrag.stats()                          # nofrag's own statistics (dict)
    snap = nofrag.snapshot(pool)            # a pool's whole state (dict)
    nofrag.export_torch_snapshot(snap, "snap.pickle.gz")  # for torch.cuda._memory_viz

Same-address offload of one block (any pool; no torch needed; see docs/offload.md):

    nofrag.offload(pool, ptr, stream=None, tier="host")   # device -> host (or "disk")
    nofrag.prefetch(pool, ptr, stream=None)               # back to device memory
    nofrag.offload_wait(pool)                             # wait for the copies
    nofrag.block_tiers(pool, ptr)   # {"device": bytes, "host": bytes, "disk": bytes}

Failures raise nofrag.NofragError (status + the library's message).

The package is pure Python over ctypes; it needs libnofrag.so: ``pip
install`` ships it inside the package (see nofrag._lib for where else it is
searched; NOFRAG_LIB=/path/to/libnofrag.so overrides).
"""

import ctypes
import json
import os
import re

from . import _lib
from ._lib import (NF_TIER_DEVICE, NF_TIER_DISK, NF_TIER_HOST, NF_TIER_HOST_DETACHED, LibraryError, NfCalls, NfStats,
                   NofragError, conf_string, last_error, load)
from .pool import Pool

# nofrag.torch_trace is imported on first use of these names, not here:
# `python3 -m nofrag.torch_trace` imports this package first, and a
# torch_trace already in sys.modules then makes runpy warn (RuntimeWarning
# "found in sys.modules ... prior to execution").
_LAZY = {"export_torch_snapshot": "torch_trace", "snapshot_to_torch": "torch_trace"}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def _version():
    """NF_VERSION of include/nofrag.h, the version's one home: written into
    _version.py by setup.py / cmake --install, read from the header in a
    source checkout."""
    try:
        from ._version import version
        return version
    except ImportError:
        pass
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "nofrag.h")
    try:
        with open(header) as f:
            m = re.search(r'^#define NF_VERSION "([^"]+)"', f.read(), re.M)
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


__version__ = _version()
__all__ = ["Pool", "LibraryError", "stats", "configure", "last_error", "conf_string", "load", "NfStats", "NfCalls", "counters", "snapshot",
           "pool_snapshot", "snapshot_to_torch", "export_torch_snapshot", "NofragError", "offload", "prefetch",
           "offload_wait", "block_tiers", "pool_stats", "pool_config", "NF_TIER_DEVICE", "NF_TIER_HOST", "NF_TIER_HOST_DETACHED",
           "NF_TIER_DISK"]


def stats(device=0):
    """nofrag's statistics for the PyTorch plug-in's pool on `device`, as a
    dict of nf_stats_t fields (bytes unless noted; "calls" is a dict of
    backend calls per kind, "call_ns" the nanoseconds spent in them, host
    waits under "event_sync"). "pool" is False while the device has no pool
    yet (every value is then 0)."""
    lib = load()
    st = NfStats()
    rc = lib.nf_torch_stats(_lib.cint(device, "nofrag.stats: device"), ctypes.byref(st))
    if rc < 0:
        raise ValueError(f"bad device {device}")
    d = st.to_dict()
    d["pool"] = rc == 0
    return d


def counters(device=0):
    """Cumulative counters kept by the plug-in (requested sizes):
    bytes_allocated, bytes_freed, allocs, frees, failed_allocs."""
    lib = load()
    arr = (ctypes.c_uint64 * 5)()
    if lib.nf_torch_counters(_lib.cint(device, "nofrag.counters: device"), arr, 5) != 0:
        raise ValueError(f"bad device {device}")
    return dict(zip(("bytes_allocated", "bytes_freed", "allocs", "frees", "failed_allocs"), arr))


def configure(conf=None, **config):
    """Set the configuration for pools the plug-in creates afterwards, as a
    string ("limit:40GiB,reserve:8GiB") and/or keywords (``limit="40GiB"``,
    ``spill="host"`` or ``spill=True``, ``spill_limit="64GiB"``,
    ``offload_dir="/scratch"``). Raises ValueError if it does not parse or if
    a pool already exists."""
    s = _lib.conf_join(conf, config, "nofrag.configure")
    if load().nf_torch_configure(s.encode() if s else None) != 0:
        raise ValueError(last_error())
    return s


def snapshot(pool=None, device=0):
    """The whole state of a pool as a dict (nf_snapshot's JSON: "totals",
    "granules", "streams", "chunks" with their "blocks" and "mapped" granule
    runs; see include/nofrag.h). `pool` is an nf_pool_t handle (a
    ctypes.c_void_p or an int address) from nf_pool_create /
    nf_pool_create_from_string; without one, the PyTorch plug-in's pool for
    `device` (ValueError if that device has not allocated through nofrag;
    a NULL handle, ``ctypes.c_void_p()`` or 0, is a ValueError too, not the
    plug-in's pool). MemoryError (with the library's message) when the
    host runs out of memory for the document.

    snapshot_to_torch / export_torch_snapshot turn the result into PyTorch's
    memory-snapshot format (device_traces from a recorded trace:
    torch_trace.trace_from_rmm). (The PyTorch snapshot -> trace converter that
    was the submodule nofrag.snapshot is now nofrag.torch_trace.)"""
    lib = load()
    if pool is None:
        device = _lib.cint(device, "nofrag.snapshot: device")
        pool = lib.nf_torch_pool(device)
        if not pool:
            raise ValueError(f"nofrag.snapshot: no pool given and the PyTorch plug-in has no pool on device {device} "
                             "(nothing allocated through nofrag there yet)")
    with _lib.use_pool(pool) as pl:
        if not pl:
            raise ValueError("nofrag.snapshot: the pool handle is NULL (pass None for the PyTorch plug-in's pool)")
        ptr = lib.nf_snapshot(pl)
        if not ptr:  # out of host memory: this thread's nf_last_error (last_error() may be another thread's)
            raise MemoryError((lib.nf_last_error() or b"nf_snapshot failed").decode(errors="replace"))
    try:
        return json.loads(ctypes.string_at(ptr).decode())
    finally:
        lib.nf_snapshot_free(ptr)


pool_snapshot = snapshot  # the name before nofrag.snapshot was freed for it


# ------------------------------------------------------------------ offload

class _Pool:
    """``with _Pool(pool) as p``: the pool's address for a library call
    (ValueError if NULL); a nofrag.Pool counts the call as in flight, so that
    its close() from another thread waits for it (Pool._use)."""

    __slots__ = ("use",)

    def __init__(self, pool):
        self.use = _lib.use_pool(pool, "pool")

    def __enter__(self):
        p = self.use.__enter__()
        if not p:
            self.use.__exit__(None, None, None)
            raise ValueError("nofrag: a pool handle is required (nf_pool_create / nf_pool_create_from_string, "
                             "or nofrag.torch's pool for a device)")
        return p

    def __exit__(self, *exc):
        return self.use.__exit__(*exc)


def _ptr(ptr):
    p = _lib.handle(ptr, "ptr")
    if not p:
        raise ValueError("nofrag: ptr is NULL")
    return p


def offload(pool, ptr, stream=None, tier="host"):
    """nf_offload: move the live block starting at `ptr` to host ("host"),
    host with the range unmapped while away ("host_detached": cheaper moves,
    no use in place) or disk ("disk") memory at the same address, on `stream`
    (None: the default stream; an int handle or a torch.cuda.Stream). From
    here until prefetch() returns, nothing may read or write the block. Only granules wholly inside
    the block move. Raises NofragError (e.g. NF_ERR_INVALID for a pointer that
    is not a live block's start; the block is then unchanged)."""
    t = _lib.tier_value(tier)
    if t == NF_TIER_DEVICE:
        raise ValueError("nofrag.offload: tier must be 'host', 'host_detached' or 'disk' (use prefetch() to come "
                         "back)")
    p, s, fn = _ptr(ptr), _lib.stream_handle(stream), _lib.require("nf_offload")
    with _Pool(pool) as pl:
        _lib.check(fn(pl, p, s, t), f"nf_offload({p:#x}, {tier})")


def prefetch(pool, ptr, stream=None):
    """nf_prefetch: bring an offloaded block back to device memory at the same
    address; work queued on `stream` afterwards sees the contents. A block that
    is not offloaded: no-op. NofragError with ``is_oom`` when device memory
    cannot be found (the block stays offloaded, intact)."""
    p, s, fn = _ptr(ptr), _lib.stream_handle(stream), _lib.require("nf_prefetch")
    with _Pool(pool) as pl:
        _lib.check(fn(pl, p, s), f"nf_prefetch({p:#x})")


def offload_wait(pool):
    """nf_offload_wait: wait (on the host) for every copy offload/prefetch
    enqueued on the pool; offloaded blocks' device granules are then free.
    Raises NofragError for the first offload that failed to finish since the
    last call, even one finished by another call (its message names the
    block, which stays intact and usable); see docs/offload.md rule 6."""
    fn = _lib.require("nf_offload_wait")
    with _Pool(pool) as pl:
        _lib.check(fn(pl), "nf_offload_wait")


def block_tiers(pool, ptr):
    """Where a live block's bytes are: {"device": n, "host": n, "disk": n}
    (spilled granules count as host; edge granules shared with neighbours as
    device)."""
    p, fn = _ptr(ptr), _lib.require("nf_block_tiers")
    out = (ctypes.c_uint64 * 3)()
    with _Pool(pool) as pl:
        _lib.check(fn(pl, p, out), f"nf_block_tiers({p:#x})")
    return {"device": out[NF_TIER_DEVICE], "host": out[NF_TIER_HOST], "disk": out[NF_TIER_DISK]}


def pool_stats(pool):
    """nf_stats_get of any pool, as a dict (see stats() for the plug-in's)."""
    st, lib = NfStats(), load()
    with _Pool(pool) as pl:
        lib.nf_stats_get(pl, ctypes.byref(st))
    return st.to_dict()


def pool_config(pool):
    """The configuration in force for a pool (nf_pool_config), as a config
    string (nf_config_format), e.g. "limit:33554432,...,spill:host,..." (sizes in bytes)."""
    lib = load()
    cfg = ctypes.create_string_buffer(8192)  # nf_config_t is opaque here; far larger than the struct
    with _Pool(pool) as pl:
        lib.nf_pool_config(pl, cfg)
    buf = ctypes.create_string_buffer(4096)
    lib.nf_config_format(cfg, buf, len(buf))
    return buf.value.decode()
