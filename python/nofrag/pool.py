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
from ._lib import NF_ERR_INVALID, NF_OK, NfStats, NofragError, conf_string

__all__ = ["Pool"]


class Pool:
    """A nofrag pool (nf_pool_t) with its own backend.

    ``conf`` is a config string ("backend:host,limit:256MiB"; see
    docs/design.md for the keys) and ``config`` the same as keywords
    (``limit="8GiB"``, ``backend="cuda"``, ``device=1``); both may be given.
    With neither, the configuration comes from $NOFRAG_CONF (like
    nf_pool_create_from_string(NULL)). The default backend is CUDA.

    Addresses are plain ints. ``stream`` arguments take None (the default
    stream), an int handle, or an object with ``cuda_stream`` (torch) or
    ``ptr`` (CuPy) holding one.
    """

    def __init__(self, conf: Optional[str] = None, **config: Any) -> None:
        self._handle = 0
        self._lock = threading.Lock()
        parts = [p for p in (conf, conf_string(**config)) if p]
        self.conf: Optional[str] = ",".join(parts) if parts else None
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
        if not self._handle:
            raise NofragError("nofrag.Pool", NF_ERR_INVALID, "the pool is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return not self._handle

    def close(self) -> None:
        """Destroy the pool: every mapping goes back to the backend and live
        blocks' addresses become invalid. Work queued on the pool's memory must
        be complete first (synchronize the streams that use it): unmapping
        memory a kernel still uses faults. Closing twice is a no-op."""
        with self._lock:
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
        size = int(size)
        if size < 0:
            raise ValueError(f"nofrag.Pool.alloc: size must be >= 0, not {size}")
        lib = _lib.load()
        p = lib.nf_alloc(self.handle, size, _lib.stream_handle(stream))
        if p:
            return int(p)
        rc = int(lib.nf_last_status())
        if rc == NF_OK and size == 0:
            return 0
        _lib.check(rc if rc != NF_OK else NF_ERR_INVALID, f"nf_alloc({size})")
        raise AssertionError("unreachable")

    def free(self, ptr: int) -> None:
        """Free the block at ``ptr`` (its start). NofragError NF_ERR_INVALID
        for a pointer that is not a live block (double free, interior
        pointer); nothing changes then. 0 is a no-op."""
        p = _lib.handle(ptr, "ptr")
        _lib.check(_lib.load().nf_free(self.handle, p or None), f"nf_free({p:#x})")

    def block_size(self, ptr: int) -> int:
        """The size the live block at ``ptr`` was allocated with (0 if none)."""
        return int(_lib.load().nf_block_size(self.handle, _lib.handle(ptr, "ptr") or None))

    def record_stream(self, ptr: int, stream: Any) -> None:
        """The block is used on ``stream`` too: reuse after its free waits for
        that stream's work (nf_record_stream)."""
        p = _lib.handle(ptr, "ptr")
        rc = _lib.load().nf_record_stream(self.handle, p or None, _lib.stream_handle(stream))
        _lib.check(rc, f"nf_record_stream({p:#x})")

    # ------------------------------------------------------------ tiers

    def offload(self, ptr: int, tier: str = "host", stream: Any = None) -> None:
        """Move the live block at ``ptr`` to "host", "host_detached" or "disk"
        memory at the same address (nf_offload; see nofrag.offload)."""
        from . import offload
        offload(self.handle, ptr, stream=stream, tier=tier)

    def prefetch(self, ptr: int, stream: Any = None) -> None:
        """Bring an offloaded block back to device memory (nf_prefetch)."""
        from . import prefetch
        prefetch(self.handle, ptr, stream=stream)

    def wait(self) -> None:
        """Wait for every offload/prefetch copy queued on the pool."""
        from . import offload_wait
        offload_wait(self.handle)

    def block_tiers(self, ptr: int) -> Dict[str, int]:
        """Bytes of the block per tier: {"device": n, "host": n, "disk": n}."""
        from . import block_tiers
        return block_tiers(self.handle, ptr)

    # ------------------------------------------------------------ state

    def stats(self) -> Dict[str, Any]:
        """nf_stats_get as a dict (bytes unless noted: "live", "mapped",
        "physical", "limit", "allocs", "frees", "fragmentation", ...)."""
        st = NfStats()
        _lib.load().nf_stats_get(self.handle, ctypes.byref(st))
        return st.to_dict()

    def snapshot(self) -> Dict[str, Any]:
        """The pool's whole state (nf_snapshot's JSON) as a dict."""
        from . import snapshot
        return snapshot(self.handle)

    def config(self) -> str:
        """The configuration in force, as a config string (nf_config_format)."""
        from . import pool_config
        return pool_config(self.handle)

    def check(self) -> None:
        """Check the pool's invariants (nf_pool_check); NofragError if broken."""
        _lib.check(_lib.load().nf_pool_check(self.handle), "nf_pool_check")

    def trim(self) -> None:
        """Give cached (free, mapped) granules back to the backend (nf_trim)."""
        _lib.check(_lib.load().nf_trim(self.handle), "nf_trim")

    def set_limit(self, limit: int) -> None:
        """Change the physical limit, in bytes (nf_set_limit)."""
        _lib.check(_lib.load().nf_set_limit(self.handle, int(limit)), f"nf_set_limit({int(limit)})")

    def add_peer(self, device: int) -> None:
        """Let GPU ``device`` read and write this pool's memory too (nf_pool_add_peer).

        Raises NofragError (status unsupported) on the host backend or where the
        driver reports no P2P path between the two devices.
        """
        _lib.check(_lib.load().nf_pool_add_peer(self.handle, int(device)), f"nf_pool_add_peer({int(device)})")
