"""The fake ``torch`` (streams, events, storages, tensors, modules, autograd's
saved-tensor hooks) and the nf_offload simulator that test_offload_torch.py
runs nofrag.torch_offload against. Split from that file (files stay small)."""

import ctypes
import types

from nofrag import _lib
from test_offload import LIB, pattern


# ====================================================================== fake torch

class FakeStream:
    _next = [100]

    def __init__(self, device=None, handle=None):
        if handle is None:
            FakeStream._next[0] += 1
            handle = FakeStream._next[0]
        self.cuda_stream = handle
        FakeTorch.log.append(("stream", handle))

    def __eq__(self, other):
        return isinstance(other, FakeStream) and other.cuda_stream == self.cuda_stream

    def __hash__(self):
        return self.cuda_stream

    def wait_stream(self, other):
        FakeTorch.log.append(("wait_stream", self.cuda_stream, other.cuda_stream))

    def wait_event(self, ev):
        FakeTorch.log.append(("wait_event", self.cuda_stream, ev.stream))


class FakeEvent:
    def __init__(self, *a, **k):
        self.stream = None

    def record(self, stream=None):
        self.stream = stream.cuda_stream if stream is not None else 1


class FakeStorage:
    def __init__(self, ptr, n):
        self.ptr, self.n = ptr, n

    def data_ptr(self):
        return self.ptr

    def nbytes(self):
        return self.n


class Node:
    def __init__(self, *next_nodes):
        self.next_functions = tuple((n, 0) for n in next_nodes)


AccumulateGrad = type("AccumulateGrad", (Node,), {})
ToCopyBackward0 = type("ToCopyBackward0", (Node,), {})
MulBackward0 = type("MulBackward0", (Node,), {})


class FakeTensor:
    def __init__(self, storage, base=None, grad_fn=None, requires_grad=False, cuda=True):
        self._storage, self._base, self.grad_fn = storage, base, grad_fn
        self.requires_grad = requires_grad or grad_fn is not None
        self.is_cuda = cuda
        self.device = types.SimpleNamespace(type="cuda" if cuda else "cpu", index=0 if cuda else None)
        self.post_acc_hooks = []

    @property
    def is_leaf(self):
        return self.grad_fn is None

    def untyped_storage(self):
        return self._storage

    def detach(self):
        return FakeTensor(self._storage, cuda=self.is_cuda)

    def view(self):
        return FakeTensor(self._storage, base=self._base or self, grad_fn=MulBackward0() if self.requires_grad else None)

    def register_post_accumulate_grad_hook(self, fn):
        self.post_acc_hooks.append(fn)
        return _Handle(self.post_acc_hooks, fn)

    def bytes(self):
        return ctypes.string_at(self._storage.ptr, self._storage.n)

    def fill(self, seed):
        ctypes.memmove(self._storage.ptr, pattern(seed, self._storage.n), self._storage.n)


class FakeParameter(FakeTensor):
    pass


class _Handle:
    def __init__(self, lst, fn):
        self.lst, self.fn = lst, fn

    def remove(self):
        if self.fn in self.lst:
            self.lst.remove(self.fn)


class FakeModule:
    """nn.Module's forward hooks (with_kwargs=True), called around `body`."""

    def __init__(self, gradient_checkpointing=False):
        self.pre, self.post = [], []
        self.gradient_checkpointing = gradient_checkpointing

    def register_forward_pre_hook(self, fn, with_kwargs=False):
        assert with_kwargs
        self.pre.append(fn)
        return _Handle(self.pre, fn)

    def register_forward_hook(self, fn, with_kwargs=False):
        assert with_kwargs
        self.post.append(fn)
        return _Handle(self.post, fn)

    def __call__(self, body, x, **kwargs):
        for f in list(self.pre):
            f(self, (x,), kwargs)
        out = body(x)
        for f in list(self.post):
            f(self, (x,), kwargs, out)
        return out


class FakeTorch(types.ModuleType):
    """Just what nofrag.torch_offload touches."""
    log = []
    hooks = []
    task = [-1]
    callbacks = []

    def __init__(self):
        super().__init__("torch")
        self.Tensor = FakeTensor
        self.nn = types.SimpleNamespace(Parameter=FakeParameter)
        main = FakeStream(handle=1)
        self.cuda = types.SimpleNamespace(
            current_device=lambda: 0, current_stream=lambda device=None: main, Stream=FakeStream, Event=FakeEvent,
            synchronize=lambda device=None: FakeTorch.log.append(("synchronize", device)))

        class saved_tensors_hooks:
            def __init__(self, pack, unpack):
                self.pair = (pack, unpack)

            def __enter__(self):
                FakeTorch.hooks.append(self.pair)

            def __exit__(self, *a):
                FakeTorch.hooks.pop()

        def queue_callback(cb):
            if FakeTorch.task[0] == -1:
                raise RuntimeError("Final callbacks can only be installed during backward pass.")
            FakeTorch.callbacks.append(cb)

        self.autograd = types.SimpleNamespace(
            graph=types.SimpleNamespace(saved_tensors_hooks=saved_tensors_hooks),
            Variable=types.SimpleNamespace(_execution_engine=types.SimpleNamespace(queue_callback=queue_callback)))
        self._C = types.SimpleNamespace(_current_graph_task_id=lambda: FakeTorch.task[0])


def fake_save(*tensors):
    """An op saving `tensors` for backward: a node holding what the hooks packed."""
    if FakeTorch.hooks:
        pack, unpack = FakeTorch.hooks[-1]
        return [(pack(t), unpack) for t in tensors]
    return [(t, None) for t in tensors]


def fake_backward(nodes, check=None):
    """Unpack every node's saved tensors in reverse order, as autograd does;
    `check(tensor)` runs on each unpacked tensor (it is resident by then)."""
    FakeTorch.task[0] = 7
    try:
        for node in reversed(nodes):
            for packed, unpack in node:
                t = unpack(packed) if unpack else packed
                if check:
                    check(t)
        for cb in FakeTorch.callbacks:
            cb()
    finally:
        FakeTorch.callbacks.clear()
        FakeTorch.task[0] = -1


class Simulator:
    """Stands in for nf_offload & co.: offloaded bytes are saved aside and the
    block is filled with 0xDE, so reading an offloaded tensor gives garbage."""

    def __init__(self):
        self.saved, self.offloads, self.prefetches = {}, 0, 0

    def offload(self, pool, ptr, stream=None, tier="host"):
        n = LIB.nf_block_size(pool, ptr)
        if not n:
            raise _lib.NofragError("nf_offload(sim)", _lib.NF_ERR_INVALID, "not a live block")
        if ptr not in self.saved:
            self.saved[ptr] = ctypes.string_at(ptr, n)
            ctypes.memset(ptr, 0xDE, n)
            self.offloads += 1

    def prefetch(self, pool, ptr, stream=None):
        if not LIB.nf_block_size(pool, ptr):
            raise _lib.NofragError("nf_prefetch(sim)", _lib.NF_ERR_INVALID, "not a live block")
        data = self.saved.pop(ptr, None)
        if data is not None:
            ctypes.memmove(ptr, data, len(data))
            self.prefetches += 1

    def block_tiers(self, pool, ptr):
        n = LIB.nf_block_size(pool, ptr)
        return {"device": 0 if ptr in self.saved else n, "host": n if ptr in self.saved else 0, "disk": 0}
