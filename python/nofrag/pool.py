"""nofrag.Pool: a pool of your own, for programs that are not PyTorch.

    import nofrag
    with nofrag.Pool("backend:host,limit:256MiB") as pool:   # or Pool(backend="cuda", limit="8GiB")
        p = pool.alloc(1 << 20)        # an address (int): device memory for backend cuda
        pool.free(p)
        pool.stats()["live"]           # 0

Every failure raises nofrag.NofragError with the library's status name
(``.status_name``, e.g. "NF_ERR_INVALID" for a double free) and message.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, Optional

from . import _lib
from ._lib import NF_ERR_INVALID, NF_OK, NfStats, NofragError, conf_join

__all__ = ["Pool"]


class Pool:
    """A nofrag pool (nf_pool_t) with its own backend.

    ``conf`` is a config string ("backend:host,limit:256MiB"; see
    docs/design.md for the keys) and ``config`` the same as keywords
    (``limit="8GiB"``, ``backend="cuda"``, ``device=1``); both may be given.
    With neither, the configuration comes from $NOFRAG_CONF (like
    nf_pool_create_from_string(NULL)). The default backend is host (CPU); pass backend="cuda" for device memory.

    Addresses are plain ints. ``stream`` arguments take None (the default
    stream), an int handle, or an object with ``cuda_stream`` (torch) or
    ``ptr`` (CuPy) holding one. Sizes, addresses and handles must be
    integers in [0, 2**64) (TypeError / ValueError otherwise: ctypes would
    wrap them silently).

    A pool may be used from several threads. ``close()`` while another
    thread is inside a call on the pool does not pull the pool from under it:
    the pool is destroyed when the last call in flight returns.
    """

    def __init__(self, conf: Optional[str] = None, **config: Any) -> None:
        self._handle = 0
        self._lock = threading.Lock()
        self._busy = 0  # calls in flight (_use) that hold the handle
        self._closing = False
        self.conf: Optional[str] = conf_join(conf, config, "nofrag.Pool") or None
        lib = _lib.load()
        out = ctypes.c_void_p()
        rc = lib.nf_pool_create_from_string(ctypes.byref(out), self.conf.encode() if self.conf else None)
        _lib.check(rc, f"nofrag.Pool({self.conf!r})")
        self._handle = out.value or 0

    # ------------------------------------------------------------ lifetime

    @property
    def handle(self) -> int:
        """The nf_pool_t address, for the module-level functions and ctypes
        (NofragError once the pool is closed)."""
        h = self._handle
        if not h or self._closing:
            raise NofragError("nofrag.Pool", NF_ERR_INVALID, "the pool is closed")
        return h

    @property
    def closed(self) -> bool:
        return self._closing or not self._handle

    def _use(self) -> "_InUse":
        """``with self._use() as h:`` around every library call given the
        handle: NofragError if the pool is closed, else the call counts as in
        flight until the block ends, and close() leaves the destroy to the
        last call in flight."""
        return _InUse(self)

    def _enter(self) -> int:
        with self._lock:
            h = self._handle
            if not h or self._closing:
                raise NofragError("nofrag.Pool", NF_ERR_INVALID, "the pool is closed")
            self._busy += 1
            return h

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1
            if not self._closing or self._busy:
                return
            h, self._handle = self._handle, 0
        if h:  # close() came while this call was in flight, and it was the last
            _lib.load().nf_pool_destroy(h)

    def close(self) -> None:
        """Destroy the pool: every mapping goes back to the backend and live
        blocks' addresses become invalid. Work queued on the pool's memory must
        be complete first (synchronize the streams that use it): unmapping
        memory a kernel still uses faults. Closing twice is a no-op. Calls
        from other threads already inside the library finish first (the
        last of them destroys the pool); later calls raise NofragError."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            h = 0
            if not self._busy:
                h, self._handle = self._handle, 0
        if h:
            _lib.load().nf_pool_destroy(h)

    def __enter__(self) -> "Pool":
        self.handle  # closed pools cannot be entered
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._handle:#x}"
        return f"nofrag.Pool({self.conf!r}, {state})"

    # ------------------------------------------------------------ blocks

    def alloc(self, size: int, stream: Any = None) -> int:
        """Allocate ``size`` bytes usable on ``stream``; returns the address
        (512-byte aligned). ``size`` 0 returns 0. NofragError (``is_oom`` when
        live memory does not fit under the limit) on failure."""
        size = _lib.uint64(size, "nofrag.Pool.alloc: size")
        lib = _lib.load()
        s = _lib.stream_handle(stream)
        h = self._enter()  # `with self._use()`, inlined: the hot path
        try:
            p = lib.nf_alloc(h, size, s)
            if p:
                return p
            rc = int(lib.nf_last_status())
            if rc == NF_OK and size == 0:
                return 0
            _lib.check(rc if rc != NF_OK else NF_ERR_INVALID, f"nf_alloc({size})")
        finally:
            self._leave()
        raise AssertionError("unreachable")

    def free(self, ptr: int) -> None:
        """Free the block at ``ptr`` (its start). NofragError NF_ERR_INVALID
        for a pointer that is not a live block (double free, interior
        pointer); nothing changes then. 0 is a no-op."""
        p = _lib.handle(ptr, "ptr")
        lib = _lib.load()
        h = self._enter()
        try:
            rc = lib.nf_free(h, p or None)
            if rc:
                _lib.check(rc, f"nf_free({p:#x})")
        finally:
            self._leave()

    def block_size(self, ptr: int) -> int:
        """The size the live block at ``ptr`` was allocated with (0 if none)."""
        p, lib = _lib.handle(ptr, "ptr"), _lib.load()
        with self._use() as h:
            return int(lib.nf_block_size(h, p or None))

    def record_stream(self, ptr: int, stream: Any) -> None:
        """The block is used on ``stream`` too: reuse after its free waits for
        that stream's work (nf_record_stream)."""
        p, s, lib = _lib.handle(ptr, "ptr"), _lib.stream_handle(stream), _lib.load()
        with self._use() as h:
            rc = lib.nf_record_stream(h, p or None, s)
            _lib.check(rc, f"nf_record_stream({p:#x})")

    def stream_known(self, stream: Any) -> bool:
        """Whether the pool knows ``stream`` and may still record events on
        it, so that it must stay alive (nf_stream_known)."""
        s, lib = _lib.stream_handle(stream), _lib.load()
        with self._use() as h:
            return int(lib.nf_stream_known(h, s)) == 1

    # ------------------------------------------------------------ tiers

    def offload(self, ptr: int, tier: str = "host", stream: Any = None) -> None:
        """Move the live block at ``ptr`` to "host", "host_detached" or "disk"
        memory at the same address (nf_offload; see nofrag.offload)."""
        from . import offload
        offload(self, ptr, stream=stream, tier=tier)

    def prefetch(self, ptr: int, stream: Any = None) -> None:
        """Bring an offloaded block back to device memory (nf_prefetch)."""
        from . import prefetch
        prefetch(self, ptr, stream=stream)

    def wait(self) -> None:
        """Wait for every offload/prefetch copy queued on the pool."""
        from . import offload_wait
        offload_wait(self)

    def block_tiers(self, ptr: int) -> Dict[str, int]:
        """Bytes of the block per tier: {"device": n, "host": n, "disk": n}."""
        from . import block_tiers
        return block_tiers(self, ptr)

    # ------------------------------------------------------------ state

    def stats(self) -> Dict[str, Any]:
        """nf_stats_get as a dict (bytes unless noted: "live", "mapped",
        "physical", "limit", "allocs", "frees", "fragmentation", ...;
        "calls" and "call_ns": backend calls and nanoseconds in them, per kind)."""
        st, lib = NfStats(), _lib.load()
        with self._use() as h:
            lib.nf_stats_get(h, ctypes.byref(st))
        return st.to_dict()

    def snapshot(self) -> Dict[str, Any]:
        """The pool's whole state (nf_snapshot's JSON) as a dict."""
        from . import snapshot
        return snapshot(self)

    def config(self) -> str:
        """The configuration in force, as a config string (nf_config_format)."""
        from . import pool_config
        return pool_config(self)

    def check(self) -> None:
        """Check the pool's invariants (nf_pool_check); NofragError if broken."""
        lib = _lib.load()
        with self._use() as h:
            rc = lib.nf_pool_check(h)
            _lib.check(rc, "nf_pool_check")

    def trim(self) -> None:
        """Give cached (free, mapped) granules back to the backend (nf_trim)."""
        lib = _lib.load()
        with self._use() as h:
            rc = lib.nf_trim(h)
            _lib.check(rc, "nf_trim")

    def set_limit(self, limit: int) -> None:
        """Change the physical limit, in bytes (nf_set_limit)."""
        limit, lib = _lib.uint64(limit, "nofrag.Pool.set_limit: limit"), _lib.load()
        with self._use() as h:
            rc = lib.nf_set_limit(h, limit)
            _lib.check(rc, f"nf_set_limit({limit})")

    def add_peer(self, device: int) -> None:
        """Let GPU ``device`` read and write this pool's memory too (nf_pool_add_peer).

        Raises NofragError (status unsupported) on the host backend or where the
        driver reports no P2P path between the two devices.
        """
        device, lib = _lib.cint(device, "nofrag.Pool.add_peer: device"), _lib.load()
        with self._use() as h:
            rc = lib.nf_pool_add_peer(h, device)
            _lib.check(rc, f"nf_pool_add_peer({device})")


class _InUse:
    """Pool._use's context manager (a class: cheaper than contextlib's)."""

    __slots__ = ("pool",)

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def __enter__(self) -> int:
        return self.pool._enter()

    def __exit__(self, *exc: Any) -> bool:
        self.pool._leave()
        return False
