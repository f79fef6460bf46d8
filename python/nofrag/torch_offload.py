"""Same-address offload of PyTorch tensors (nofrag.torch.offload and friends).

Everything here works on the *storage* of a tensor: under nofrag's
pluggable allocator a storage is one nofrag block, and
``t.untyped_storage().data_ptr()`` is the block's start. Offloading moves the
block's whole granules to host (or disk) memory at the same virtual address,
so the tensor object, its ``data_ptr()`` and every view of it stay valid; they
just must not be touched until the block is prefetched (views share the
storage: they move too). The rules and limits are in docs/offload.md.

``offload(t)`` / ``prefetch(t)`` are the primitives. ``offload_optimizer(opt)``
keeps optimizer state on the host between steps; ``offload_activations()`` is a
saved-tensors-hooks context that offloads the activations saved by a forward
pass when the context exits (or, with ``layers=``, as each layer's forward
returns) and prefetches them during backward.

torch is imported when a function is called, never at import time.
"""

import threading

from . import _lib
from . import block_tiers as _nf_block_tiers
from . import offload as _nf_offload
from . import prefetch as _nf_prefetch
from ._lib import NF_ERR_INVALID, NofragError
# The helpers and offload_activations live in private modules (files stay
# small); imported here, they stay reachable as before (tests clear _streams).
from ._offload_activations import offload_activations  # noqa: F401
from ._offload_common import _device_index, _side_stream, _streams, _torch, _warn_once, pool  # noqa: F401


def _block(t):
    """(torch, device index, storage start) of a CUDA tensor."""
    torch = _torch()
    dev = _device_index(torch, t)
    return torch, dev, t.untyped_storage().data_ptr()


def offload(t, tier="host", stream=None):
    """Move tensor `t`'s storage to `tier` ("host", "host_detached" or "disk")
    at the same address; returns `t` (same object, same data_ptr()). The copy is ordered
    on `stream` (default: the current stream of t's device) after the work
    queued there. Until prefetch(t), nothing may read or write t or any view
    of its storage. An empty storage is left alone. Raises NofragError."""
    torch, dev, ptr = _block(t)
    if ptr:
        _nf_offload(pool(dev), ptr, stream if stream is not None else torch.cuda.current_stream(dev), tier)
    return t


def prefetch(t, stream=None):
    """Bring `t`'s storage back to device memory; work queued on `stream`
    (default: the current stream) afterwards sees the contents; other streams
    must wait on that stream first. No-op if not offloaded. Returns `t`."""
    torch, dev, ptr = _block(t)
    if ptr:
        _nf_prefetch(pool(dev), ptr, stream if stream is not None else torch.cuda.current_stream(dev))
    return t


def block_tiers(t):
    """Bytes of t's storage per tier: {"device": n, "host": n, "disk": n}."""
    _, dev, ptr = _block(t)
    if not ptr:
        return {"device": 0, "host": 0, "disk": 0}
    return _nf_block_tiers(pool(dev), ptr)


# ================================================================ optimizer state

class OptimizerOffload:
    """What offload_optimizer() returns: ``remove()`` (prefetch everything and
    unhook), ``prefetch()`` (bring the state back now, e.g. before reading it),
    and ``stats`` (a dict of counts)."""

    def __init__(self, opt, tier="host", min_bytes=2 << 20, prefetch_in_backward=True, side_streams=True):
        self._torch = _torch()
        _lib.tier_value(tier)  # validates
        self.opt, self.tier, self.min_bytes = opt, tier, int(min_bytes)
        self.side_streams = side_streams
        self.stats = {"steps": 0, "offloaded_tensors": 0, "offloaded_bytes": 0, "prefetched_tensors": 0,
                      "prefetched_in_backward": 0, "failed_offloads": 0, "failed_early_prefetches": 0}
        self._off = {}       # (device, ptr) -> nbytes: offloaded by this handle, not prefetched yet
        self._events = {}    # device -> event recorded after the last step's offloads
        self._used = set()   # devices whose prefetch stream the step must wait for
        self._lock = threading.RLock()
        self._warned = set()
        self._handles = [opt.register_step_pre_hook(self._pre_step), opt.register_step_post_hook(self._post_step)]
        for name, hook in (("register_state_dict_pre_hook", lambda o: self.prefetch()),
                           ("register_load_state_dict_pre_hook", lambda o, sd: self.prefetch())):
            reg = getattr(opt, name, None)
            if reg is not None:
                self._handles.append(reg(hook))
        if prefetch_in_backward:
            for group in opt.param_groups:
                for p in group["params"]:
                    reg = getattr(p, "register_post_accumulate_grad_hook", None)
                    if reg is not None and getattr(p, "requires_grad", False):
                        self._handles.append(reg(self._grad_ready))

    # -- helpers
    def _stream(self, dev, purpose):
        torch = self._torch
        if not self.side_streams:
            return torch.cuda.current_stream(dev)
        return _side_stream(torch, dev, purpose)

    def _state_tensors(self, states):
        """(device, ptr, nbytes) of the distinct, large enough CUDA storages."""
        torch = self._torch
        seen = set()
        for st in states:
            for v in st.values():
                if not isinstance(v, torch.Tensor) or not v.is_cuda:
                    continue
                stg = v.untyped_storage()
                ptr, n = stg.data_ptr(), stg.nbytes()
                dev = _device_index(torch, v)
                if not ptr or n < self.min_bytes or (dev, ptr) in seen:
                    continue
                seen.add((dev, ptr))
                yield dev, ptr, n

    def _prefetch_keys(self, keys, strict):
        """Prefetch (device, ptr) keys on each device's prefetch stream, after
        that device's offload copies. strict: raise on failure."""
        torch = self._torch
        by_dev = {}
        for k in keys:
            by_dev.setdefault(k[0], []).append(k)
        for dev, ks in by_dev.items():
            s = self._stream(dev, "prefetch")
            ev = self._events.get(dev)
            if ev is not None and s != torch.cuda.current_stream(dev):
                s.wait_event(ev)
            p = pool(dev)
            for k in ks:
                try:
                    _nf_prefetch(p, k[1], s)
                except NofragError as e:
                    if e.status == NF_ERR_INVALID:  # the block is gone (state replaced or freed): forget it
                        self._off.pop(k, None)
                        continue
                    if strict:
                        raise NofragError(f"nofrag.torch.offload_optimizer: prefetch of optimizer state "
                                          f"({self._off.get(k, 0)} bytes)", e.status, e.detail) from e
                    self.stats["failed_early_prefetches"] += 1
                    continue
                self._off.pop(k, None)
                self.stats["prefetched_tensors"] += 1
            self._used.add(dev)

    def _wait(self):
        torch = self._torch
        for dev in self._used:
            if self.side_streams:
                torch.cuda.current_stream(dev).wait_stream(self._stream(dev, "prefetch"))
        self._used.clear()

    # -- hooks
    def _grad_ready(self, p):
        # Runs in backward (autograd thread) once p's gradient is accumulated:
        # its state is needed at the next step, so start bringing it back.
        st = self.opt.state.get(p) if hasattr(self.opt.state, "get") else None
        if not st:
            return
        with self._lock:
            keys = [(d, ptr) for d, ptr, _ in self._state_tensors([st]) if (d, ptr) in self._off]
            if keys:
                n = self.stats["prefetched_tensors"]
                self._prefetch_keys(keys, strict=False)
                self.stats["prefetched_in_backward"] += self.stats["prefetched_tensors"] - n

    def _pre_step(self, opt, args, kwargs):
        self.prefetch()

    def _post_step(self, opt, args, kwargs):
        torch = self._torch
        with self._lock:
            self.stats["steps"] += 1
            by_dev = {}
            for dev, ptr, n in self._state_tensors(opt.state.values()):
                if (dev, ptr) not in self._off:  # (a skipped pre-hook leaves some offloaded)
                    by_dev.setdefault(dev, []).append((ptr, n))
            for dev, items in by_dev.items():
                cur = torch.cuda.current_stream(dev)
                s = self._stream(dev, "offload")
                if s != cur:
                    s.wait_stream(cur)  # the step's kernels first (nf_offload orders on the
                    # allocation stream too; this makes it explicit)
                p = pool(dev)
                for ptr, n in items:
                    try:
                        _nf_offload(p, ptr, s, self.tier)
                    except NofragError as e:  # stays on the device, intact
                        self.stats["failed_offloads"] += 1
                        _warn_once(self, "offload", f"nofrag.torch.offload_optimizer: state stays on the device: {e}")
                        continue
                    self._off[(dev, ptr)] = n
                    self.stats["offloaded_tensors"] += 1
                    self.stats["offloaded_bytes"] += n
                ev = torch.cuda.Event()
                ev.record(s)
                self._events[dev] = ev

    # -- public
    def prefetch(self):
        """Bring every offloaded state tensor back now; the current stream of
        each device waits for the copies. Raises NofragError (e.g. out of
        memory) when a tensor cannot come back."""
        with self._lock:
            self._prefetch_keys(list(self._off), strict=True)
            self._wait()

    def remove(self):
        """Prefetch everything and remove the hooks."""
        try:
            self.prefetch()
        finally:
            for h in self._handles:
                h.remove()
            self._handles = []

    @property
    def offloaded_bytes(self):
        return sum(self._off.values())


def offload_optimizer(opt, tier="host", min_bytes=2 << 20, prefetch_in_backward=True, side_streams=True,
                      mode="swap"):
    """Keep `opt`'s state on the host between steps: after each ``opt.step()``
    the CUDA state tensors of at least `min_bytes` (exp_avg, exp_avg_sq, ...)
    are offloaded (step post-hook), and before the next step they come back
    (step pre-hook). With `prefetch_in_backward`, a parameter's state starts
    coming back as soon as its gradient is accumulated (post-accumulate-grad
    hook), so the copies overlap the rest of backward. With `side_streams`,
    the copies run on side streams (offload after the step's kernels, prefetch
    before the step's), so they overlap forward/backward compute.

    Reading the state between steps is forbidden while it is offloaded; the
    optimizer's state_dict() / load_state_dict() prefetch it first (hooks), or
    call ``handle.prefetch()``. Returns an OptimizerOffload (``.remove()``).

    ``mode="resident"``: the state is created in host memory at the first step
    and used there in place by every step (no copies per step; see
    nofrag.torch_resident). Only `min_bytes` applies then."""
    if mode == "resident":
        from .torch_resident import ResidentOptimizerState
        return ResidentOptimizerState(opt, min_bytes=min_bytes, pool=pool, block_tiers=block_tiers)
    if mode != "swap":
        raise ValueError(f"nofrag.torch.offload_optimizer: mode must be 'swap' or 'resident', not {mode!r}")
    return OptimizerOffload(opt, tier=tier, min_bytes=min_bytes, prefetch_in_backward=prefetch_in_backward,
                            side_streams=side_streams)
