"""Optimizer state resident in host memory, used in place by the GPU.

``nofrag.torch.offload_optimizer(opt, mode="resident")`` returns a
ResidentOptimizerState. The state tensors (AdamW's exp_avg, exp_avg_sq, ...)
are created in host memory at the optimizer's first step -- each is
allocated, moved to the host tier at the same address and waited for, so the
device never holds more than one of them -- and stay there: every later
step's kernels read and write them over the bus (no copies, no remapping, no
driver calls per step). The device then holds parameters, gradients and
activations only. The cost is the step's memory traffic at host-link speed
instead of HBM speed.

Why not copy the state in before each step and out after (mode="swap")? The
step needs all of it at once, so the peak would not drop; and the copies
and remaps cost more than reading it in place once.

Rules: the tensors keep their identity and data_ptr(); state_dict() works
(the GPU reads host memory); ``remove()`` brings the state back to the device
(after a device synchronize: the rule of nf_prefetch).
"""

from . import _lib
from . import prefetch as _nf_prefetch


class ResidentOptimizerState:
    """What offload_optimizer(opt, mode="resident") returns: ``remove()``,
    ``stats`` (tensors and bytes placed on the host, steps seen)."""

    def __init__(self, opt, min_bytes=2 << 20, *, pool, block_tiers):
        # pool(device) and block_tiers(tensor) come from nofrag.torch_offload,
        # which creates this object: this module imports nothing of it.
        import torch
        self._torch, self._pool, self._block_tiers, self.opt = torch, pool, block_tiers, opt
        self.min_bytes = int(min_bytes)
        self.stats = {"host_tensors": 0, "host_bytes": 0, "steps": 0}
        self._lib = _lib.load()
        if not hasattr(self._lib, "nf_torch_set_host_alloc"):
            raise _lib.NofragError("nf_torch_set_host_alloc", _lib.NF_ERR_INVALID,
                                   "this libnofrag.so has no nf_torch_set_host_alloc: rebuild it")
        self._prev, self._armed = 0, False
        self._handles = [opt.register_step_pre_hook(self._pre), opt.register_step_post_hook(self._post)]
        # A step that raises (an OOM caught and retried) skips the post hooks:
        # the host placement set by the pre hook would then stay in force on
        # this thread and send every later allocation >= min_bytes, forward
        # activations too, to host memory. The instance's step (the class's,
        # or a scheduler's wrapper) is wrapped to end it in any case.
        self._own_step = "step" in vars(opt)
        self._step, self._wrapper = getattr(opt, "step", None), None

        def step(*args, **kwargs):
            try:
                return self._step(*args, **kwargs)
            finally:
                self._disarm()
        if self._step is not None:
            opt.step = self._wrapper = step

    def _params(self):
        for g in self.opt.param_groups:
            for p in g["params"]:
                yield p

    def _pre(self, opt, args, kwargs):
        # New state (the first step, or a parameter that gets its first
        # gradient late) is created in host memory.
        if any(p.grad is not None and not self.opt.state.get(p) for p in self._params()):
            self._prev = self._lib.nf_torch_set_host_alloc(self.min_bytes)
            self._armed = True

    def _disarm(self):
        if self._armed:
            self._lib.nf_torch_set_host_alloc(self._prev)
            self._prev, self._armed = 0, False

    def _post(self, opt, args, kwargs):
        self._disarm()
        self.stats["steps"] += 1
        n = b = 0
        for st in self.opt.state.values():
            for v in st.values():
                if isinstance(v, self._torch.Tensor) and v.is_cuda and v.untyped_storage().nbytes() >= self.min_bytes:
                    tiers = self._tiers(v)
                    n += tiers["host"] > 0
                    b += tiers["host"]
        self.stats["host_tensors"], self.stats["host_bytes"] = n, b

    def _tiers(self, t):
        return self._block_tiers(t)

    def remove(self):
        """Unhook and bring every state tensor back to the device."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._wrapper is not None and vars(self.opt).get("step") is self._wrapper:  # else wrapped again since: the wrapper stays, harmless
            if self._own_step:
                self.opt.step = self._step
            else:
                del self.opt.step
        torch = self._torch
        todo = []
        for st in self.opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.is_cuda and v.untyped_storage().data_ptr():
                    dev = v.device.index if v.device.index is not None else torch.cuda.current_device()
                    todo.append((dev, v.untyped_storage().data_ptr()))
        # In-place use must be complete before a prefetch, on every device that
        # holds state (torch.cuda.synchronize() alone waits for the current one).
        for dev in sorted({d for d, _ in todo}):
            torch.cuda.synchronize(dev)
        for dev, ptr in todo:
            _nf_prefetch(self._pool(dev), ptr, torch.cuda.current_stream(dev))
