"""nofrag: GPU memory that does not fragment.

    import nofrag.torch
    nofrag.torch.enable(limit="40GiB")     # before CUDA is initialised
    ...
    nofrag.stats()                          # nofrag's own statistics (dict)
    snap = nofrag.snapshot(pool)            # a pool's whole state (dict)
    nofrag.export_torch_snapshot(snap, "snap.pickle.gz")  # for torch.cuda._memory_viz

The package is pure Python over ctypes; it needs libnofrag.so (see
nofrag._lib for where it is searched, or set NOFRAG_LIB).
"""

import ctypes
import json

from . import _lib
from ._lib import NfStats, conf_string, last_error, load
from .torch_trace import export_torch_snapshot, snapshot_to_torch

__version__ = "0.1.0"
__all__ = ["stats", "configure", "last_error", "conf_string", "load", "NfStats", "counters", "snapshot", "pool_snapshot",
           "snapshot_to_torch", "export_torch_snapshot"]


def stats(device=0):
    """nofrag's statistics for the PyTorch plug-in's pool on `device`, as a
    dict of nf_stats_t fields (bytes unless noted; "calls" is a dict of
    backend calls per kind). "pool" is False while the device has no pool
    yet (every value is then 0)."""
    lib = load()
    st = NfStats()
    rc = lib.nf_torch_stats(int(device), ctypes.byref(st))
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
    if lib.nf_torch_counters(int(device), arr, 5) != 0:
        raise ValueError(f"bad device {device}")
    return dict(zip(("bytes_allocated", "bytes_freed", "allocs", "frees", "failed_allocs"), arr))


def configure(conf=None, **config):
    """Set the configuration for pools the plug-in creates afterwards, as a
    string ("limit:40GiB,reserve:8GiB") and/or keywords. Raises ValueError if
    it does not parse or if a pool already exists."""
    s = ",".join(p for p in (conf, conf_string(**config)) if p)
    if load().nf_torch_configure(s.encode() if s else None) != 0:
        raise ValueError(last_error())
    return s


def snapshot(pool=None, device=0):
    """The whole state of a pool as a dict (nf_snapshot's JSON: "totals",
    "granules", "streams", "chunks" with their "blocks" and "mapped" granule
    runs; see include/nofrag.h). `pool` is an nf_pool_t handle (a
    ctypes.c_void_p or an int address) from nf_pool_create /
    nf_pool_create_from_string; without one, the PyTorch plug-in's pool for
    `device` (ValueError if that device has not allocated through nofrag).

    snapshot_to_torch / export_torch_snapshot turn the result into PyTorch's
    memory-snapshot format (device_traces from a recorded trace:
    torch_trace.trace_from_rmm). (The PyTorch snapshot -> trace converter that
    was the submodule nofrag.snapshot is now nofrag.torch_trace.)"""
    lib = load()
    # Declared here rather than in _lib._declare: c_void_p (not c_char_p) as
    # the result type keeps the pointer so that the library can free it.
    lib.nf_snapshot.restype = ctypes.c_void_p
    lib.nf_snapshot.argtypes = [ctypes.c_void_p]
    lib.nf_snapshot_free.restype = None
    lib.nf_snapshot_free.argtypes = [ctypes.c_void_p]
    if isinstance(pool, ctypes.c_void_p):
        pool = pool.value
    if not pool:
        lib.nf_torch_pool.restype = ctypes.c_void_p
        lib.nf_torch_pool.argtypes = [ctypes.c_int]
        pool = lib.nf_torch_pool(device)
    if not pool:
        raise ValueError(f"nofrag.snapshot: no pool given and the PyTorch plug-in has no pool on device {device} "
                         "(nothing allocated through nofrag there yet)")
    ptr = lib.nf_snapshot(pool)
    if not ptr:
        raise MemoryError(last_error())
    try:
        return json.loads(ctypes.string_at(ptr).decode())
    finally:
        lib.nf_snapshot_free(ptr)


pool_snapshot = snapshot  # the name before nofrag.snapshot was freed for it
