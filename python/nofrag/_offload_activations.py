"""offload_activations (re-exported by nofrag.torch_offload and nofrag.torch):
the activations saved by a forward pass, offloaded and brought back in
backward. Split from torch_offload.py (files stay small)."""

import threading
import weakref

from . import _lib
from . import offload as _nf_offload
from . import prefetch as _nf_prefetch
from ._lib import NofragError
from ._offload_common import _device_index, _side_stream, _torch, _warn_once, pool


# ================================================================ activations

_DEAD, _RESIDENT, _OFFLOADED, _PREFETCHING = range(4)


class _Entry:
    """One recorded storage (one nofrag block) of one forward pass."""
    __slots__ = ("gen", "dev", "ptr", "nbytes", "index", "refs", "state", "event")

    def __init__(self, gen, dev, ptr, nbytes, index):
        self.gen, self.dev, self.ptr, self.nbytes, self.index = gen, dev, ptr, nbytes, index
        self.refs, self.state, self.event = [], _RESIDENT, None

    def alive(self):
        return any(r() is not None for r in self.refs)


class _Gen:
    """What one `with` block recorded: entries by (device, ptr), their order,
    the stack of pending (not yet offloaded) lists, the offload events."""

    def __init__(self):
        self.entries, self.order, self.pending, self.offload_ev = {}, [], [[]], {}
        self.cb_task = None


class _Saved:
    __slots__ = ("t", "entry", "__weakref__")

    def __init__(self, t, entry):
        self.t, self.entry = t, entry


def _tensors_in(torch, obj, out, depth=0):
    """Tensors in nested lists / tuples / dicts (HF ModelOutput is a dict)."""
    if depth > 6:
        return out
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors_in(torch, x, out, depth + 1)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors_in(torch, x, out, depth + 1)
    return out


class offload_activations:
    """Context manager: activations saved for backward by the code inside are
    offloaded to `tier`, and brought back during backward. ::

        with nofrag.torch.offload_activations(min_bytes=4 << 20):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).loss
        loss.backward()

    Recorded: plain CUDA tensors with at least `min_bytes` of storage that
    belong to the autograd graph -- not leaves (parameters, buffers, inputs)
    nor views of them, not autocast's casts of parameters (autocast may reuse
    them) -- one entry per storage. Nothing moves while the forward may still
    read what it saved: the recorded storages are offloaded, on a side stream,
    when the context exits. With ``layers=[...]`` (e.g. the transformer
    blocks), each layer's recorded storages are offloaded as soon as that
    layer's forward returns, except the storages of its inputs and outputs
    (the next layer reads them); only this lowers the forward's peak. Layers
    must not use activation checkpointing (refused). What is saved outside
    the layers (the head, the loss: needed first by backward) is offloaded at
    exit only if `outside` (default: True without `layers`, False with).

    In backward, unpacking a saved tensor prefetches its storage (the current
    stream waits for the copy) and starts prefetching the next `ahead`
    recorded storages (reverse order of recording) on a side stream. At the
    end of backward whatever is still offloaded and alive comes back.
    Between the end of the context and backward, do not read a tensor the
    forward saved (an output that an op also saved, an HF Cache object's
    keys/values, ...): call ``ctx.prefetch_all()`` first. ``ctx.stats``
    counts what happened.

    `tier`: "host_detached" (default: the storage's range is unmapped while
    away -- a stray read faults -- and each 2 MiB moved costs one unmap out and
    one map back, several times cheaper than "host"), "host" (host memory
    mapped at the same address) or "disk".
    """

    def __init__(self, min_bytes=4 << 20, tier="host_detached", ahead=4, layers=None, outside=None,
                 skip_param_casts=True):
        _lib.tier_value(tier)
        self.min_bytes, self.tier, self.ahead = int(min_bytes), tier, max(0, int(ahead))
        self.skip_param_casts = skip_param_casts
        self.layers = list(layers) if layers is not None else []
        self.outside = (not self.layers) if outside is None else bool(outside)
        for m in self.layers:
            if getattr(m, "gradient_checkpointing", False):
                raise ValueError("nofrag.torch.offload_activations: layers=... does not combine with activation "
                                 "checkpointing of those layers (the recomputation saves nothing to offload)")
        self.stats = {"packed": 0, "recorded_storages": 0, "offloaded_storages": 0, "offloaded_bytes": 0,
                      "kept_as_layer_io": 0, "prefetched_storages": 0, "prefetched_ahead": 0, "failed_offloads": 0,
                      "failed_ahead_prefetches": 0}
        self._lock = threading.RLock()
        self._warned = set()
        self._gen = _Gen()
        self._hooks, self._layer_handles = None, []

    # -- context
    def __enter__(self):
        torch = self._torch = _torch()
        self._gen = _Gen()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        try:
            for m in self.layers:
                self._layer_handles.append(m.register_forward_pre_hook(self._layer_begin, with_kwargs=True))
                self._layer_handles.append(m.register_forward_hook(self._layer_end, with_kwargs=True))
        except BaseException:
            self._close_hooks(None, None, None)
            raise
        return self

    def _close_hooks(self, et, ev, tb):
        for h in self._layer_handles:
            h.remove()
        self._layer_handles = []
        self._hooks.__exit__(et, ev, tb)

    def __exit__(self, et, ev, tb):
        self._close_hooks(et, ev, tb)
        g = self._gen
        keys = [k for lst in g.pending for k in lst]  # (lists left open by a layer that raised included)
        g.pending = [[]]
        if et is None and self.outside:
            self._offload(g, keys, set())
        return False

    def _layer_begin(self, module, args, kwargs):
        self._gen.pending.append([])

    def _layer_end(self, module, args, kwargs, output):
        g = self._gen
        if len(g.pending) < 2:
            return
        keys = g.pending.pop()
        keep = set()
        for t in _tensors_in(self._torch, (args, kwargs, output), []):
            try:
                keep.add(t.untyped_storage().data_ptr())
            except Exception:
                pass
        self._offload(g, keys, keep)

    # -- recording
    def _is_param_cast(self, t):
        fn = t.grad_fn
        if fn is None or not type(fn).__name__.startswith("ToCopyBackward"):
            return False
        return any(nf is not None and type(nf).__name__ == "AccumulateGrad" for nf, _ in fn.next_functions)

    def _eligible(self, t):
        torch = self._torch
        if type(t) is not torch.Tensor or not t.is_cuda:  # Parameters and other subclasses: no
            return None
        base = t._base if t._base is not None else t
        if base.is_leaf or (self.skip_param_casts and self._is_param_cast(base)):
            return None
        stg = t.untyped_storage()
        ptr, n = stg.data_ptr(), stg.nbytes()
        if not ptr or n < self.min_bytes:
            return None
        return _device_index(torch, t), ptr, n

    def _pack(self, t):
        self.stats["packed"] += 1
        try:
            info = self._eligible(t)
        except Exception:  # anything unusual (no storage, ...) stays as it is
            info = None
        saved = _Saved(t.detach(), None)  # detach: the graph must not hold t itself (reference cycle)
        if info is not None:
            g = self._gen
            dev, ptr, n = info
            e = g.entries.get((dev, ptr))
            if e is None or (e.state == _RESIDENT and not e.alive()):  # new, or a new storage at a freed address
                e = g.entries[(dev, ptr)] = _Entry(g, dev, ptr, n, len(g.order))
                g.order.append((dev, ptr))
                g.pending[-1].append((dev, ptr))
                self.stats["recorded_storages"] += 1
            e.refs.append(weakref.ref(saved))
            saved.entry = e
        return saved

    def _offload(self, g, keys, keep):
        torch = self._torch
        by_dev = {}
        for key in keys:
            e = g.entries.get(key)
            if e is None or e.state != _RESIDENT:
                continue
            if not e.alive():
                e.state = _DEAD
            elif e.ptr in keep:
                self.stats["kept_as_layer_io"] += 1
            else:
                by_dev.setdefault(e.dev, []).append(e)
        for dev, es in by_dev.items():
            cur = torch.cuda.current_stream(dev)
            s = _side_stream(torch, dev, "activations")
            s.wait_stream(cur)  # the forward's kernels that write them come first
            p = pool(dev)
            for e in es:
                try:
                    _nf_offload(p, e.ptr, s, self.tier)
                except NofragError as err:
                    self.stats["failed_offloads"] += 1
                    _warn_once(self, "offload", f"nofrag.torch.offload_activations: kept on the device: {err}")
                    continue
                e.state = _OFFLOADED
                self.stats["offloaded_storages"] += 1
                self.stats["offloaded_bytes"] += e.nbytes
            ev = torch.cuda.Event()
            ev.record(s)
            g.offload_ev[dev] = ev

    # -- backward
    def _issue_ahead(self, e):
        torch = self._torch
        s = _side_stream(torch, e.dev, "activations")
        try:
            _nf_prefetch(pool(e.dev), e.ptr, s)
        except NofragError:
            self.stats["failed_ahead_prefetches"] += 1  # fetched on demand later
            return
        ev = torch.cuda.Event()
        ev.record(s)
        e.event, e.state = ev, _PREFETCHING
        self.stats["prefetched_ahead"] += 1

    def _bring(self, e):
        """Make e resident for the current stream of its device."""
        torch = self._torch
        cur = torch.cuda.current_stream(e.dev)
        if e.state == _OFFLOADED:
            ev = e.gen.offload_ev.get(e.dev)
            if ev is not None:
                cur.wait_event(ev)  # the offload copies (side stream) before the copy back
            try:
                _nf_prefetch(pool(e.dev), e.ptr, cur)
            except NofragError as err:
                raise NofragError(f"nofrag.torch.offload_activations: prefetch of a saved activation "
                                  f"({e.nbytes} bytes)", err.status, err.detail) from err
            self.stats["prefetched_storages"] += 1
        elif e.state == _PREFETCHING:
            cur.wait_event(e.event)
            self.stats["prefetched_storages"] += 1
        e.state, e.event = _RESIDENT, None

    def _queue_finish(self, g):
        torch = self._torch
        try:
            task = torch._C._current_graph_task_id()
        except Exception:
            task = -1
        if task != -1 and task == g.cb_task:
            return
        try:
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self._finish(g))
            g.cb_task = task
        except Exception:  # not in a backward, or no such API: prefetch_all() is then the caller's
            pass

    def _unpack(self, saved):
        e = saved.entry
        if e is None or e.state in (_RESIDENT, _DEAD):
            return saved.t
        with self._lock:
            g = e.gen
            self._bring(e)
            left, j, scanned = self.ahead, e.index - 1, 0
            while left > 0 and j >= 0 and scanned < 64:
                f = g.entries[g.order[j]]
                j -= 1
                scanned += 1
                if f.state not in (_OFFLOADED, _PREFETCHING) or not f.alive():
                    continue
                if f.state == _OFFLOADED:
                    self._issue_ahead(f)
                left -= 1
            self._queue_finish(g)
        return saved.t

    def _finish(self, g):
        with self._lock:
            for key in g.order:
                e = g.entries[key]
                if e.state in (_OFFLOADED, _PREFETCHING) and e.alive():
                    self._bring(e)

    def prefetch_all(self):
        """Bring every recorded storage that is still offloaded (and alive)
        back; the current streams wait for the copies. Runs by itself at the
        end of backward."""
        self._finish(self._gen)

    def resident(self):
        """True when nothing recorded is offloaded any more."""
        return all(e.state in (_RESIDENT, _DEAD) or not e.alive() for e in self._gen.entries.values())
