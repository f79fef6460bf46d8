"""What nofrag.torch_offload and its activation offload (nofrag._offload_activations)
both use: the plug-in's pool of a device, a tensor's device, the side streams,
one warning per handle. Split from torch_offload.py (files stay small).
"""

import threading
import warnings

from . import _lib
from ._lib import NF_ERR_INVALID, NofragError

_streams = {}  # (device, purpose) -> torch.cuda.Stream
_streams_lock = threading.Lock()


def _torch():
    import torch
    return torch


def pool(device=0):
    """The plug-in's nf_pool_t* (an int) for `device` (an index); NofragError if
    nofrag has no pool there (nofrag.torch.enable() not in force, or nothing
    allocated on that device yet)."""
    p = _lib.load().nf_torch_pool(int(device))
    if not p:
        raise NofragError("nf_torch_pool", NF_ERR_INVALID,
                          f"no nofrag pool on device {device}: is nofrag.torch.enable() in force and has the "
                          "device allocated through it?")
    return p


def _device_index(torch, t):
    if not getattr(t, "is_cuda", False):
        raise ValueError(f"nofrag: expected a CUDA tensor, got one on {getattr(t, 'device', '?')}")
    idx = t.device.index
    return torch.cuda.current_device() if idx is None else int(idx)


def _side_stream(torch, dev, purpose):
    key = (dev, purpose)
    with _streams_lock:
        s = _streams.get(key)
        if s is None:
            s = _streams[key] = torch.cuda.Stream(device=dev)
        return s


def _warn_once(owner, key, msg):
    if key not in owner._warned:
        owner._warned.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
