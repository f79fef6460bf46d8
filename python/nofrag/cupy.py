"""CuPy on nofrag: route CuPy's device allocations to a nofrag pool.

    import cupy, nofrag.cupy
    nofrag.cupy.enable(limit="40GiB")     # before allocating; device = CuPy's current device
    x = cupy.zeros(1 << 28)               # allocated by nofrag
    nofrag.cupy.pool().stats()            # nofrag's statistics
    nofrag.cupy.disable()                 # back to CuPy's own memory pool

CuPy's allocator is process-wide and a nofrag pool serves one device, so each
device gets its own pool, made with the same configuration the first time
CuPy allocates on it (``pools()`` lists them; the limit applies per device).
A configuration that names a device (``device=1``) keeps nofrag on that one:
allocating while CuPy's current device is another raises RuntimeError.

Each allocation becomes nf_alloc on CuPy's current stream, wrapped as a
``cupy.cuda.MemoryPointer`` over ``cupy.cuda.UnownedMemory`` whose owner
frees the block (nf_free) when CuPy drops its last reference. Use on other
streams is not tracked: as with CuPy's own pool, a block freed while another
stream still uses it must be ordered by the caller (or record it with
``pool().record_stream(ptr, stream)``). A pool may record events on a
stream it knows long after a free on it, so the stream objects CuPy
allocated on are kept alive while the pool knows them: a ``cupy.cuda.Stream``
made per step is destroyed once the pool has forgotten it (a pool keeps 64
streams and forgets those no live block names when a 65th comes, after one
wait for the device; see nf_stream_t in nofrag.h). A request that does not fit raises
``cupy.cuda.memory.OutOfMemoryError`` (from the NofragError).
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any, Dict, Optional

from ._lib import NofragError
from .pool import Pool

__all__ = ["enable", "disable", "pool", "pools", "enabled"]

_lock = threading.Lock()
_pool: Optional[Pool] = None  # the one enable() made
_pools: Dict[int, Pool] = {}  # CuPy device -> its pool


class _Block:
    """Owner of one allocation: frees it when CuPy's memory object dies. It
    holds the pool, so a pool outlives its blocks even after disable()."""

    __slots__ = ("pool", "ptr", "__weakref__")

    def __init__(self, pool_: Pool, ptr: int) -> None:
        self.pool, self.ptr = pool_, ptr

    def __del__(self) -> None:
        if self.ptr and not self.pool.closed:
            try:
                self.pool.free(self.ptr)
            except Exception:  # a finalizer must not raise (interpreter shutdown)
                pass


def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise ImportError("nofrag.cupy needs CuPy (pip install cupy-cuda12x)") from e
    return cupy


def enable(conf: Optional[str] = None, **config: Any) -> Pool:
    """Create a nofrag pool on CuPy's current device and make it CuPy's
    allocator (``cupy.cuda.set_allocator``). ``conf`` / ``config`` as for
    nofrag.Pool (``limit="40GiB"``, ``granule``, ...; with neither,
    ``$NOFRAG_CONF``); the backend is CUDA and the device CuPy's current one
    unless they say otherwise. Returns the pool.
    RuntimeError if already enabled (disable() first)."""
    global _pool, _pools
    cupy = _cupy()
    with _lock:
        if _pool is not None:
            raise RuntimeError("nofrag.cupy.enable: already enabled (nofrag.cupy.disable() first)")
        device = cupy.cuda.runtime.getDevice()
        if not conf and not config:  # as nofrag.torch.enable() and nofrag.Pool()
            conf = os.environ.get("NOFRAG_CONF") or None
        # device=None is no device (conf_string drops None values)
        pinned = config.get("device") is not None or re.search(r"(?:^|,)\s*device\s*:", conf or "") is not None

        def make(d: int) -> Pool:
            # Defaults first: later keys win in a nofrag config string.
            q = Pool(",".join(s for s in (f"backend:cuda,device:{d}", conf) if s), **config)
            # Stream handle -> CuPy's stream object: alive while the pool
            # knows the handle (it may record events on it), dropped once
            # the pool has forgotten it, which lets CuPy destroy the stream.
            # On the pool: its blocks keep it (and so these) past disable().
            q._cupy_streams = {}
            q._cupy_prune_at = 64 + 16
            return q

        p = make(device)
        m = re.search(r"(?:^|,)device:(\d+)", p.config())  # the device the pool is on, config included
        dev_id = int(m.group(1)) if m else device
        pools = {dev_id: p}
        def hold(q: Pool, stream: Any) -> None:
            # Under the lock, the look-up too: a prune running in another
            # thread may have found this stream forgotten just before this
            # allocation made the pool know it again; it must not drop it.
            with _lock:
                held = q._cupy_streams
                if stream.ptr in held:
                    return
                held[stream.ptr] = stream
                if len(held) > q._cupy_prune_at:
                    for k in [k for k in held if not q.stream_known(k)]:
                        del held[k]
                    # Amortised: a pool knows 64 streams, and more while live
                    # blocks name them (a stream per request, each holding
                    # memory): the next prune comes after a quarter more.
                    q._cupy_prune_at = len(held) + max(16, len(held) // 4)

        def pool_of(d: int) -> Pool:
            q = pools.get(d)
            if q is not None:
                return q
            if pinned:
                raise RuntimeError(f"nofrag.cupy: CuPy allocates on device {d}, but nofrag's pool is on device "
                                   f"{dev_id} (the configuration names it); enable() without a device key "
                                   f"gives every device its own pool")
            with _lock:
                q = pools.get(d)
                if q is None:
                    q = pools[d] = make(d)
            return q

        def malloc(size: int):
            d = cupy.cuda.runtime.getDevice()
            if size == 0:
                return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, d), 0)
            q = pool_of(d)
            stream = cupy.cuda.get_current_stream()
            try:
                ptr = q.alloc(size, stream=stream)
            except NofragError as e:
                if not e.is_oom:
                    raise
                st = q.stats()
                raise cupy.cuda.memory.OutOfMemoryError(size, st["physical"], st["limit"]) from e
            hold(q, stream)
            mem = cupy.cuda.UnownedMemory(ptr, size, _Block(q, ptr), d)
            return cupy.cuda.MemoryPointer(mem, 0)

        cupy.cuda.set_allocator(malloc)
        _pool, _pools = p, pools  # the same dict malloc fills
        return p


def disable() -> None:
    """Give CuPy back its default memory pool. Blocks nofrag allocated stay
    valid until CuPy frees them; the pool goes away after the last one."""
    global _pool, _pools
    cupy = _cupy()
    with _lock:
        if _pool is None:
            return
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
        _pool, _pools = None, {}


def enabled() -> bool:
    """Whether CuPy allocates through nofrag (enable() without disable())."""
    return _pool is not None


def pool(device: Optional[int] = None) -> Pool:
    """The pool enable() made, or with ``device`` that device's pool
    (RuntimeError when not enabled, KeyError when CuPy has not allocated
    on that device yet)."""
    if _pool is None:
        raise RuntimeError("nofrag.cupy: not enabled (call nofrag.cupy.enable() first)")
    return _pool if device is None else _pools[device]


def pools() -> Dict[int, Pool]:
    """Every device's pool so far, by CuPy device id ({} when not enabled)."""
    with _lock:
        return dict(_pools)
