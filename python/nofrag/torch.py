"""Use nofrag as PyTorch's CUDA allocator.

    import nofrag.torch
    nofrag.torch.enable(limit="40GiB")   # must run before CUDA is initialised

``enable`` first installs the C++ adapter (nofrag.torch_adapter, built
against this torch on first use; docs/pytorch.md): a full PyTorch allocator
with CUDA graphs, MemPool, memory snapshots, CUDA IPC, native memory_stats and
torch.OutOfMemoryError. Where it cannot be built, or with ``adapter=False``,
the ctypes path below is used (a RuntimeWarning names what it lacks).

The ctypes path installs ``torch.cuda.memory.CUDAPluggableAllocator(libnofrag.so,
"nf_torch_alloc", "nf_torch_free")`` and wires the optional hooks through
``allocator().set_*_fn`` (all reachable from Python in PyTorch 2.11):

============================  =====================================  =========================
PyTorch call                  pluggable-allocator hook               nofrag
============================  =====================================  =========================
lazy CUDA init                ``set_init_fn``                        ``nf_torch_init``
``torch.cuda.empty_cache``    ``set_reset_fn``                       ``nf_trim`` on every pool
``set_per_process_memory_     ``set_memory_fraction_fn``             ``nf_set_limit(fraction x
fraction``                                                           total device memory)``
``Tensor.record_stream``      ``set_record_stream_fn``               ``nf_record_stream``
============================  =====================================  =========================

PyTorch's statistics functions raise "CUDAPluggableAllocator does not yet
support getDeviceStats" (resetPeakStats, resetAccumulatedStats and
getMemoryFraction likewise) under any pluggable allocator, so ``enable``
replaces them, in both ``torch.cuda`` and ``torch.cuda.memory``, with versions
answering from nofrag's counters under PyTorch's key names:

=====================================  ==============================================
PyTorch key (``.all`` and ``.large_pool``; ``.small_pool`` is all zeros)
-------------------------------------------------------------------------------------
``allocated_bytes.*.current/peak``     ``live_rounded`` / ``live_rounded_peak`` (512 B rounding)
``allocated_bytes.*.allocated/freed``  cumulative requested bytes (plug-in counters)
``requested_bytes.*.current/peak``     ``live`` / ``live_peak``
``requested_bytes.*.allocated/freed``  cumulative requested bytes
``active_bytes.*``                     same as ``allocated_bytes``
``reserved_bytes.*.current/peak``      ``physical`` / ``physical_peak`` (granules created)
``reserved_bytes.*.allocated/freed``   granules created / released x granule
``inactive_split_bytes.*.current``     ``cached`` (mapped, not live); peak = current
``allocation.*`` / ``active.*``        ``live_blocks`` (peak = current: not tracked);
                                       allocated/freed = ``allocs`` / ``frees``
``segment.*``                          granules: physical/G, physical_peak/G, creates, releases
``num_alloc_retries``                  ``reclaims`` (stitching: cached granules unmapped and re-used)
``num_ooms``                           ``ooms``
``num_device_alloc`` / ``_free``       ``calls.map`` / ``calls.unmap``
``num_sync_all_streams``               ``calls.event_sync``
``nofrag.<field>``                     every nf_stats_t field (``nofrag.mapped``, ...)
=====================================  ==============================================

``memory_allocated`` / ``max_memory_allocated`` / ``memory_reserved`` /
``max_memory_reserved`` follow from that table. ``reset_peak_memory_stats``
resets nofrag's peaks; ``reset_accumulated_memory_stats`` zeroes the
cumulative counters; ``memory_summary`` prints a nofrag table;
``get_per_process_memory_fraction`` answers the last fraction set.

Out of memory: PyTorch does not check the pointer a pluggable allocator
returns, so a NULL would become a tensor at address 0. The plug-in raises
instead, through libc10's ``torchCheckFail`` (a ``RuntimeError`` whose text
starts with "CUDA out of memory (nofrag)"). ``enable`` hands the symbol to the
library; ``install_info()["oom_raises"]`` says whether that worked.

Not available on the ctypes path (a pluggable allocator's limits, see
docs/pytorch.md; the adapter has them): memory snapshots /
``_record_memory_history``, CUDA IPC of tensors (torch.multiprocessing), and
CUDA graph private pools.

Spill and same-address offload (docs/offload.md): ``enable(spill="host")``
backs allocations that do not fit on the device with host memory;
``offload(t)`` / ``prefetch(t)`` move a tensor's storage to the host and back
at the same address; ``offload_optimizer(opt)`` and ``offload_activations()``
build on them (module nofrag.torch_offload).
"""

import collections
import ctypes
import os

from . import _lib
from ._lib import NfStats, NofragError, load  # noqa: F401 (NofragError: re-exported)
from .torch_offload import (OptimizerOffload, block_tiers, offload, offload_activations,  # noqa: F401
                            offload_optimizer, pool, prefetch)

_state = {"enabled": False, "allocator": None, "hooks": {}, "patched": [], "oom_raises": False,
          "baseline": {}, "adapter": None, "adapter_error": ""}

_TORCH_CHECK_FAIL = "_ZN3c106detail14torchCheckFailEPKcS2_jS2_"


def is_enabled():
    return _state["enabled"]


def install_info():
    """What enable() did: hooks set, functions patched, whether OOM raises."""
    return {k: _state[k] for k in ("enabled", "hooks", "patched", "oom_raises", "adapter", "adapter_error")}


# ------------------------------------------------------------------ stats

def _raw(device):
    lib = load()
    st = NfStats()
    lib.nf_torch_stats(int(device), ctypes.byref(st))
    arr = (ctypes.c_uint64 * 6)()
    lib.nf_torch_counters(int(device), arr, 6)
    return st.to_dict(), list(arr)


def _stat(cur, peak, allocated, freed):
    return {"current": int(cur), "peak": int(peak), "allocated": int(allocated), "freed": int(freed)}


def _pools(all_):
    zero = {k: 0 for k in all_}
    return {"all": dict(all_), "large_pool": dict(all_), "small_pool": zero}


def nested_stats(device=0):
    """PyTorch's memory_stats_as_nested_dict() computed from nofrag (table in
    the module docstring). Works without torch (used by the tests)."""
    s, (b_alloc, b_freed, _n_alloc, _n_free, _fails, refused) = _raw(device)
    base = _state["baseline"].get(int(device), {})

    def acc(key, v):  # cumulative value since reset_accumulated_memory_stats
        return max(0, int(v) - int(base.get(key, 0)))

    g = s["granule"] or 1
    calls = s["calls"]
    allocs, frees = acc("allocs", s["allocs"]), acc("frees", s["frees"])
    out = {
        "allocated_bytes": _pools(_stat(s["live_rounded"], s["live_rounded_peak"], b_alloc, b_freed)),
        "requested_bytes": _pools(_stat(s["live"], s["live_peak"], b_alloc, b_freed)),
        "active_bytes": _pools(_stat(s["live_rounded"], s["live_rounded_peak"], b_alloc, b_freed)),
        # Device granules created / released (bytes), not driver calls: a unit
        # is one call for many granules, and spill's host granules are not device memory.
        "reserved_bytes": _pools(_stat(s["physical"], s["physical_peak"], acc("create", s["physical_created"]),
                                       acc("release", s["physical_released"]))),
        "inactive_split_bytes": _pools(_stat(s["cached"], s["cached"], 0, 0)),
        "allocation": _pools(_stat(s["live_blocks"], s["live_blocks"], allocs, frees)),
        "active": _pools(_stat(s["live_blocks"], s["live_blocks"], allocs, frees)),
        "inactive_split": _pools(_stat(0, 0, 0, 0)),
        "segment": _pools(_stat(s["physical"] // g, s["physical_peak"] // g,
                                acc("create", s["physical_created"]) // g, acc("release", s["physical_released"]) // g)),
        "oversize_allocations": _stat(0, 0, 0, 0),
        "oversize_segments": _stat(0, 0, 0, 0),
        "num_alloc_retries": acc("reclaims", s["reclaims"]),
        "num_ooms": acc("ooms", s["ooms"] + refused),  # refused: by the memory fraction, before the pool
        "num_sync_all_streams": acc("event_sync", calls["event_sync"]),
        "num_device_alloc": acc("map", calls["map"]),
        "num_device_free": acc("unmap", calls["unmap"]),
        "max_split_size": -1,
        "nofrag": {k: (v if k != "calls" else dict(v)) for k, v in s.items()},
    }
    return out


def flat_stats(device=0):
    """PyTorch's memory_stats(): the nested dict flattened with "." and sorted."""
    result = []

    def rec(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                rec(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            result.append((prefix, obj))

    rec("", nested_stats(device))
    result.sort()
    return collections.OrderedDict(result)


def _mark_baseline(device):
    s, counters = _raw(device)
    c = s["calls"]
    _state["baseline"][int(device)] = {
        "allocs": s["allocs"], "frees": s["frees"], "ooms": s["ooms"] + counters[5], "reclaims": s["reclaims"],
        "create": s["physical_created"], "release": s["physical_released"], "map": c["map"], "unmap": c["unmap"],
        "event_sync": c["event_sync"]}


def summary(device=0):
    """A short text table in the spirit of torch.cuda.memory_summary()."""
    s, (b_alloc, b_freed, n_alloc, n_free, fails, _refused) = _raw(device)

    def gib(x):
        return f"{x / 2**30:10.3f} GiB"

    rows = [
        ("live (requested)", gib(s["live"]), gib(s["live_peak"])),
        ("allocated (512 B rounded)", gib(s["live_rounded"]), gib(s["live_rounded_peak"])),
        ("mapped", gib(s["mapped"]), gib(s["mapped_peak"])),
        ("physical (reserved)", gib(s["physical"]), gib(s["physical_peak"])),
        ("cached (mapped, not live)", gib(s["cached"]), ""),
        ("limit", gib(s["limit"]), ""),
        ("spilled (host, by spill)", gib(s.get("spilled", 0)), gib(s.get("spilled_peak", 0))),
        ("offloaded (host)", gib(s.get("offloaded", 0)), ""),
        ("offloaded (disk)", gib(s.get("offloaded_disk", 0)), ""),
        ("host physical", gib(s.get("host_physical", 0)), gib(s.get("host_physical_peak", 0))),
    ]
    lines = ["=" * 72, f" nofrag memory summary, device {device}".ljust(72), "-" * 72,
             f" {'':32} {'current':>16} {'peak':>16}"]
    lines += [f" {a:32} {b:>16} {c:>16}" for a, b, c in rows]
    lines += ["-" * 72,
              f" live blocks {s['live_blocks']}, allocs {s['allocs']}, frees {s['frees']}, "
              f"OOMs {s['ooms']}, failed allocs (plug-in) {fails}",
              f" reclaims {s['reclaims']} ({s['reclaimed_granules']} granules), cross-stream reuses "
              f"{s['cross_stream_reuses']}, fragmentation {s['fragmentation']:.4f}",
              f" spills {s.get('spills', 0)}, offloads {s.get('offloads', 0)}, prefetches "
              f"{s.get('prefetches', 0)}",
              f" backend calls {s['backend_calls']}: " + ", ".join(
                  f"{k} {v}" for k, v in s["calls"].items() if v),
              f" time in them {s.get('backend_ns', 0) * 1e-9:.3f} s: " + ", ".join(
                  f"{k} {v * 1e-9:.3f}" for k, v in sorted(s.get("call_ns", {}).items(), key=lambda kv: -kv[1])[:4]
                  if v),
              f" granule {s['granule']} B, bytes allocated {b_alloc}, freed {b_freed}, "
              f"allocs {n_alloc}, frees {n_free}",
              "=" * 72]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ enable

def _device_index(torch, device):
    if device is None:
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    return torch.cuda._get_device_index(device, optional=True)


def _find_thrower(torch):
    """Address of c10::detail::torchCheckFail in the libc10.so torch loaded."""
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for name in ("libc10.so", "libc10.dylib"):
        p = os.path.join(libdir, name)
        if os.path.exists(p):
            try:
                return ctypes.cast(ctypes.CDLL(p)[_TORCH_CHECK_FAIL], ctypes.c_void_p).value
            except (OSError, AttributeError):
                return None
    return None


def enable(conf=None, **config):
    """Install nofrag as PyTorch's CUDA allocator.

    `conf` is a config string and/or keywords (``enable(limit="40GiB")`` ->
    "limit:40GiB"; ``spill="host"`` or ``spill=True`` with ``spill_limit=``
    to back what does not fit on the device with host memory; ``offload_dir=``
    for disk offload); without either, ``$NOFRAG_CONF`` applies. Must run before
    CUDA is initialised (before the first CUDA tensor, or anything calling
    torch.cuda's lazy init). Calling it again once enabled does nothing.

    The C++ adapter (nofrag.torch_adapter: CUDA graphs, torch.compile's
    graph trees, MemPool, cudnn.benchmark, torch.OutOfMemoryError, memory
    snapshots, CUDA IPC, native memory_stats) is built against this torch on
    first use and installed; where it cannot be, a RuntimeWarning says why and
    what is missing, and the ctypes path is used. ``adapter=False`` (or
    NOFRAG_ADAPTER=0) forces the ctypes path.
    """
    try:
        import torch
    except ImportError as e:
        raise ImportError("nofrag.torch needs PyTorch, a CUDA build (pip install torch)") from e

    use_adapter = config.pop("adapter", None)
    if _state["enabled"]:
        return install_info()
    if not torch.cuda.is_available():
        raise RuntimeError("nofrag.torch.enable: CUDA is not available in this PyTorch / on this machine")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "nofrag.torch.enable() must run before CUDA is initialised: this process has already "
            "created CUDA tensors or called torch.cuda lazy init, so PyTorch's own allocator is in "
            "use and cannot be swapped. Call nofrag.torch.enable() at the top of the script, right "
            "after `import torch`.")
    lib = load()
    s = _lib.conf_join(conf, config, "nofrag.torch.enable")
    # Without arguments the pools read $NOFRAG_CONF when they are made, at the
    # first CUDA allocation: parse it now, so that a typo fails here.
    src = "nofrag.torch.enable"
    if not s and os.environ.get("NOFRAG_CONF"):
        s, src = os.environ["NOFRAG_CONF"], "nofrag.torch.enable: $NOFRAG_CONF"
    if lib.nf_torch_configure(s.encode() if s else None) != 0:
        raise ValueError(f"{src}: {_lib.last_error()}")

    # The C++ adapter (nofrag/torch_adapter.py): a full PyTorch allocator.
    # adapter=False or NOFRAG_ADAPTER=0 keeps the ctypes path.
    if use_adapter is not False and os.environ.get("NOFRAG_ADAPTER", "1") != "0":
        from . import torch_adapter
        ok, info = torch_adapter.install()
        if ok:
            _state.update(enabled=True, adapter=info, hooks={}, patched=[], oom_raises=True)
            return install_info()
        _state["adapter_error"] = info
        import warnings
        warnings.warn("nofrag: the C++ adapter is not available (" + info + "); using the ctypes path, "
                      "which lacks: " + "; ".join(torch_adapter.FALLBACK_MISSING), RuntimeWarning, stacklevel=2)

    alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib.path(), "nf_torch_alloc", "nf_torch_free")
    raw = alloc.allocator()
    hooks = {}
    for setter, sym in (("set_init_fn", "nf_torch_init"), ("set_reset_fn", "nf_torch_reset"),
                        ("set_memory_fraction_fn", "nf_torch_set_fraction"),
                        ("set_record_stream_fn", "nf_torch_record_stream")):
        fn = getattr(raw, setter, None)
        if fn is None:
            hooks[setter] = False
            continue
        fn(ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value)
        hooks[setter] = True
    torch.cuda.memory.change_current_allocator(alloc)
    _state.update(enabled=True, allocator=alloc, hooks=hooks)
    _state["oom_raises"] = bool(lib.nf_torch_set_thrower(_find_thrower(torch)))
    _patch(torch)
    return install_info()


def _patch(torch):
    lib = load()

    def memory_stats(device=None):
        return flat_stats(_device_index(torch, device))

    def memory_stats_as_nested_dict(device=None):
        return nested_stats(_device_index(torch, device))

    def memory_allocated(device=None):
        return memory_stats(device).get("allocated_bytes.all.current", 0)

    def max_memory_allocated(device=None):
        return memory_stats(device).get("allocated_bytes.all.peak", 0)

    def memory_reserved(device=None):
        return memory_stats(device).get("reserved_bytes.all.current", 0)

    def max_memory_reserved(device=None):
        return memory_stats(device).get("reserved_bytes.all.peak", 0)

    def reset_peak_memory_stats(device=None):
        lib.nf_torch_reset_peaks(_device_index(torch, device))

    def reset_accumulated_memory_stats(device=None):
        d = _device_index(torch, device)
        lib.nf_torch_reset_counters(d)
        _mark_baseline(d)

    def memory_summary(device=None, abbreviated=False):
        return summary(_device_index(torch, device))

    def get_per_process_memory_fraction(device=None):
        return lib.nf_torch_get_fraction(_device_index(torch, device))

    def set_per_process_memory_fraction(fraction, device=None):
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        lib.nf_torch_set_fraction(fraction, _device_index(torch, device))

    def empty_cache():
        lib.nf_torch_reset()

    repl = {
        "memory_stats": memory_stats,
        "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
        "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_reserved,
        "max_memory_reserved": max_memory_reserved,
        "memory_cached": memory_reserved,
        "max_memory_cached": max_memory_reserved,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_max_memory_allocated": reset_peak_memory_stats,
        "reset_max_memory_cached": reset_peak_memory_stats,
        "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
        "memory_summary": memory_summary,
        "get_per_process_memory_fraction": get_per_process_memory_fraction,
    }
    # The hooks route these through PyTorch itself; patch only where missing.
    if not _state["hooks"].get("set_reset_fn"):
        repl["empty_cache"] = empty_cache
    if not _state["hooks"].get("set_memory_fraction_fn"):
        repl["set_per_process_memory_fraction"] = set_per_process_memory_fraction
    patched = []
    for mod in (torch.cuda.memory, torch.cuda):
        for name, fn in repl.items():
            if hasattr(mod, name):
                fn.__doc__ = f"nofrag replacement of torch.cuda.{name} (see nofrag.torch)."
                setattr(mod, name, fn)
                patched.append(f"{mod.__name__}.{name}")
    _state["patched"] = patched


def stats(device=0):
    """nofrag's own statistics (same as nofrag.stats)."""
    from . import stats as _s
    return _s(device)


def stream_known(stream, device=None):
    """Whether device ``device``'s pool knows ``stream`` (a torch.cuda.Stream,
    ExternalStream or raw handle) and may still record events on it: keep an
    external stream alive while this is True (nf_stream_known; docs/pytorch.md
    "Streams"). False when the pool is not made yet. Without ``device``, the
    stream's own device (``stream.device_index``), else 0 (a raw handle): a
    stream of cuda:1 was looked up in device 0's pool and read as unknown."""
    from ._lib import stream_handle
    lib = load()
    if device is None:
        device = getattr(stream, "device_index", None)
    h = lib.nf_torch_pool(int(device or 0))
    return bool(h) and int(lib.nf_stream_known(h, stream_handle(stream))) == 1
