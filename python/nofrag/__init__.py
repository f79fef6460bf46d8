"""nofrag: GPU memory that does not fragment.

    import nofrag.torch
    nofrag.torch.enable(limit="40GiB")     # before CUDA is initialised
    ...
    nofrag.stats()                          # nofrag's own statistics (dict)

The package is pure Python over ctypes; it needs libnofrag.so (see
nofrag._lib for where it is searched, or set NOFRAG_LIB).
"""

import ctypes

from . import _lib
from ._lib import NfStats, conf_string, last_error, load

__version__ = "0.1.0"
__all__ = ["stats", "configure", "last_error", "conf_string", "load", "NfStats", "counters"]


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
