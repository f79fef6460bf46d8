"""ctypes binding of libnofrag.so (no compile step), and the one place where
the package declares the C functions' signatures (``_declare``).

The library is searched, in order, at:

1. ``$NOFRAG_LIB`` (a path to the .so). When set it is the only candidate: a
   path that is missing or does not load raises ``LibraryError`` naming it,
2. the package directory (``libnofrag.so`` shipped inside the package by
   ``pip install``),
3. ``../../build/libnofrag.so`` relative to the package, only when the package
   is a source checkout's ``python/nofrag`` (``../..`` has CMakeLists.txt and
   include/nofrag.h: built with ``cmake -S . -B build && cmake --build build``);
   a package copied elsewhere never picks up an unrelated build/. In a
   checkout that has both (an editable install's copy beside a build), the
   newer of 2 and 3 is tried first,
4. for the copy ``cmake --install`` puts under ``PREFIX/share/nofrag/python``:
   ``PREFIX/LIBDIR/libnofrag.so``, LIBDIR being the install's
   CMAKE_INSTALL_LIBDIR (lib, lib64, lib/x86_64-linux-gnu...) as
   ``_version.libdir`` records it, relative to the package (a moved prefix
   still works),
5. ``ctypes.util.find_library("nofrag")`` (system install).

``NfStats`` mirrors ``nf_stats_t`` from include/nofrag.h field for field; the
library exports ``nf_stats_size()`` and ``nf_stats_offset(name)`` so that the
tests (python/tests/test_python.py) prove the mirror matches the build.

``NofragError`` is what the package raises when a library call fails: it
carries the status (``.status``, ``.status_name``) and ``nf_last_error()``.
"""

import ctypes
import ctypes.util
import operator
import os
import threading

_u64 = ctypes.c_uint64

# nf_status_t and nf_tier_t (include/nofrag.h).
NF_OK, NF_ERR_INVALID, NF_ERR_OOM, NF_ERR_BACKEND, NF_ERR_CONFIG, NF_ERR_UNSUPPORTED, NF_ERR_NOMEM, \
    NF_ERR_NOT_READY, NF_ERR_FOREIGN = range(9)
NF_TIER_DEVICE, NF_TIER_HOST, NF_TIER_DISK, NF_TIER_HOST_DETACHED = 0, 1, 2, 3
TIERS = {"device": NF_TIER_DEVICE, "host": NF_TIER_HOST, "disk": NF_TIER_DISK, "host_detached": NF_TIER_HOST_DETACHED}


class NofragError(RuntimeError):
    """A nofrag library call failed. ``status`` is the nf_status_t value,
    ``status_name`` its name ("NF_ERR_OOM"), ``detail`` the library's message
    (nf_last_error of the calling thread) when it belongs to this failure."""

    def __init__(self, what, status, detail=""):
        self.what, self.status, self.detail = what, int(status), detail
        self.status_name = _status_name(status)
        msg = f"{what} failed: {self.status_name}"
        super().__init__(f"{msg}: {detail}" if detail else msg)

    def __reduce__(self):
        # The default (type(self), self.args) would call __init__ with the
        # message alone: unpicklable (a process pool lost the real error).
        return type(self), (self.what, self.status, self.detail), self.__dict__

    @property
    def is_oom(self):
        return self.status == NF_ERR_OOM


class LibraryError(NofragError, OSError):
    """libnofrag.so could not be loaded: ``path`` is the file (or, when nothing
    was found, None), and the message says every place tried. An OSError too,
    for callers that catch the loader's usual error."""

    def __init__(self, message, path=None):
        self.what, self.status, self.status_name, self.detail = "load libnofrag", NF_ERR_CONFIG, "NF_ERR_CONFIG", message
        self.path = path
        OSError.__init__(self, message)

    def __reduce__(self):
        return type(self), (self.detail, self.path), self.__dict__

    def __str__(self):
        return self.detail


def _status_name(status):
    try:
        lib = load()
        name = lib.nf_status_str(int(status))
        if name:
            return name.decode(errors="replace")
    except (OSError, AttributeError):
        pass
    return f"status {int(status)}"


def check(rc, what):
    """Raise NofragError for a non-zero nf_status_t `rc` of the call `what`.
    The thread's nf_last_error() is attached only when nf_last_status()
    agrees with `rc` (the message is otherwise left over from an earlier
    failure: the library has no way to clear it)."""
    rc = int(rc)
    if rc == NF_OK:
        return
    detail = ""
    try:
        lib = load()
        if int(lib.nf_last_status()) == rc:
            detail = (lib.nf_last_error() or b"").decode(errors="replace")
    except (OSError, AttributeError):
        pass
    raise NofragError(what, rc, detail)


def require(name):
    """The library function `name`, or NofragError naming the library file
    when this build lacks it (an older libnofrag.so)."""
    fn = getattr(load(), name, None)
    if fn is None:
        raise NofragError(name, NF_ERR_UNSUPPORTED,
                          f"{_path} does not export it (an older build: rebuild libnofrag.so from this checkout)")
    return fn


U64_END = 1 << 64
INT_MIN, INT_END = -(1 << 31), 1 << 31


def _integer(value, what):
    """operator.index(value) (ints and integer types such as numpy's), but
    TypeError for bool, float and anything else: ctypes would silently
    truncate or wrap them."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}") from None


def uint64(value, what):
    """`value` as an unsigned 64-bit integer (uint64_t, size_t and pointer
    arguments): TypeError if not an integer (bool and float included),
    ValueError outside [0, 2**64) (ctypes would wrap it: 2**64 + n -> n)."""
    if type(value) is int and 0 <= value < U64_END:  # the usual case, fast
        return value
    v = _integer(value, what)
    if not 0 <= v < U64_END:
        raise ValueError(f"{what} must be in [0, 2**64), not {v}")
    return v


def cint(value, what):
    """`value` as a C int (device indexes): TypeError if not an integer,
    ValueError outside [-2**31, 2**31) (ctypes would wrap it: 2**32 -> 0)."""
    v = _integer(value, what)
    if not INT_MIN <= v < INT_END:
        raise ValueError(f"{what} must be in [-2**31, 2**31), not {v}")
    return v


class _Held:
    """A raw handle in a `with` (what use_pool gives for anything but a
    nofrag.Pool)."""

    __slots__ = ("h",)

    def __init__(self, h):
        self.h = h

    def __enter__(self):
        return self.h

    def __exit__(self, *exc):
        return False


def use_pool(value, what="pool"):
    """A context manager giving the pool address of `value` (see handle())
    for the length of a library call: for a nofrag.Pool it counts the call in
    flight, so that a close() from another thread waits for it (Pool._use)."""
    use = getattr(value, "_use", None)
    if use is not None:
        return use()
    return _Held(handle(value, what))


def handle(value, what="pool"):
    """An address from a ctypes.c_void_p, an int, a nofrag.Pool (its
    ``handle``), or None/0 (-> 0). TypeError for anything else (bool and
    float too), ValueError for an int outside [0, 2**64)."""
    if type(value) is int and 0 <= value < U64_END:  # the usual case, fast
        return value
    if value is None:
        return 0
    if isinstance(getattr(value, "handle", None), int):
        return value.handle
    if isinstance(value, ctypes.c_void_p):
        return value.value or 0
    if isinstance(value, int) and not isinstance(value, bool):
        return uint64(value, what)
    raise TypeError(f"{what} must be a ctypes.c_void_p or an int address, not {type(value).__name__}")


def stream_handle(stream):
    """nf_stream_t from None (default stream), an int, a ctypes.c_void_p, or
    anything with a ``cuda_stream`` (torch.cuda.Stream) or ``ptr``
    (cupy.cuda.Stream) attribute."""
    if stream is None:
        return None
    for attr in ("cuda_stream", "ptr"):
        cs = getattr(stream, attr, None)
        if cs is not None:
            return uint64(cs, f"stream.{attr}") or None
    return handle(stream, "stream") or None


def tier_value(tier):
    """nf_tier_t from "host" / "host_detached" / "disk" / "device" or the integer."""
    if isinstance(tier, str):
        try:
            return TIERS[tier.lower()]
        except KeyError:
            raise ValueError(f"unknown tier {tier!r}: expected one of {', '.join(TIERS)}") from None
    if isinstance(tier, int) and not isinstance(tier, bool) and tier in TIERS.values():
        return tier
    raise ValueError(f"unknown tier {tier!r}: expected one of {', '.join(TIERS)}")


class NfCalls(ctypes.Structure):
    """Mirror of nf_calls_t: backend calls made by a pool, per kind."""

    _fields_ = [(n, _u64) for n in (
        "va_reserve", "va_release", "create", "release", "map", "unmap", "set_access",
        "event_create", "event_record", "event_query", "event_sync", "stream_wait", "copy")]


class NfStats(ctypes.Structure):
    """Mirror of nf_stats_t (include/nofrag.h). Keep the order identical."""

    _fields_ = [(n, _u64) for n in (
        "live", "live_peak", "live_rounded", "live_rounded_peak", "mapped", "mapped_peak",
        "physical", "physical_peak", "limit", "granule", "cached", "live_blocks",
        "largest_free_mapped", "live_granules", "allocs", "frees", "invalid_frees", "ooms",
        "reclaims", "reclaimed_granules", "cross_stream_reuses")] + [
        ("calls", NfCalls),
        ("backend_calls", _u64),
        ("fragmentation", ctypes.c_double),
    ] + [(n, _u64) for n in (  # host tier (spill and offload)
        "spilled", "spilled_peak", "offloaded", "offloaded_disk", "host_physical", "host_physical_peak",
        "spills", "offloads", "prefetches", "views", "view_reuses", "view_moves", "view_evictions",
        "units", "units_made", "units_unmapped", "unit_splits", "physical_created", "physical_released",
        "edges", "edges_made")] + [
        ("call_ns", NfCalls),  # nanoseconds in backend calls, per kind (host waits: event_sync)
        ("backend_ns", _u64),
    ]

    def to_dict(self):
        d = {}
        for name, _ in self._fields_:
            v = getattr(self, name)
            if isinstance(v, NfCalls):
                v = {n: getattr(v, n) for n, _ in NfCalls._fields_}
            d[name] = v
        return d


_lock = threading.Lock()
_lib = None
_path = None


def _install_libdir():
    """The library directory of a ``cmake --install`` (relative to the
    package, or absolute) from the generated _version.py; None elsewhere (a
    checkout has no _version.py, setup.py's has no libdir)."""
    try:
        from ._version import libdir
    except ImportError:
        return None
    return libdir or None


def _mtime(path):
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(here, "libnofrag.so")
    root = os.path.dirname(os.path.dirname(here))
    if os.path.isfile(os.path.join(root, "CMakeLists.txt")) and os.path.isfile(os.path.join(root, "include", "nofrag.h")):
        # A source checkout. An editable install (pip install -e) leaves a
        # copy in the package directory that a later cmake --build does not
        # update: the newer of the two comes first, so a rebuilt library is
        # the one loaded.
        built = os.path.join(root, "build", "libnofrag.so")
        tb, tp = _mtime(built), _mtime(bundled)
        newer_built = tb is not None and (tp is None or tb > tp)
        yield from ((built, bundled) if newer_built else (bundled, built))
    else:
        yield bundled
    libdir = _install_libdir()
    if libdir:
        yield os.path.normpath(os.path.join(here, libdir, "libnofrag.so"))
    found = ctypes.util.find_library("nofrag")
    if found:
        yield found


def _declare(lib):
    """argtypes/restype of every function the package uses (wrong defaults
    would truncate 64-bit pointers and sizes)."""
    vp, sz, i, d, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_double, ctypes.c_char_p
    sig = {
        "nf_torch_alloc": (vp, [sz, i, vp]),
        "nf_torch_free": (None, [vp, sz, i, vp]),
        "nf_torch_init": (None, [i]),
        "nf_torch_reset": (None, []),
        "nf_torch_set_fraction": (None, [d, i]),
        "nf_torch_get_fraction": (d, [i]),
        "nf_torch_record_stream": (None, [vp, vp]),
        "nf_torch_stats": (i, [i, ctypes.POINTER(NfStats)]),
        "nf_torch_counters": (i, [i, ctypes.POINTER(_u64), i]),
        "nf_torch_reset_counters": (None, [i]),
        "nf_torch_reset_peaks": (None, [i]),
        "nf_torch_configure": (i, [cp]),
        "nf_torch_config_string": (i, [i, ctypes.c_char_p, sz]),
        "nf_torch_shutdown": (None, []),
        "nf_torch_last_error": (cp, []),
        "nf_torch_last_status": (i, []),
        "nf_torch_free_any": (i, [vp]),
        "nf_torch_set_thrower": (i, [vp]),
        "nf_torch_set_throw": (i, [i]),
        "nf_torch_device_count": (i, []),
        "nf_stats_size": (sz, []),
        "nf_stats_offset": (sz, [cp]),
        "nf_last_error": (cp, []),
        "nf_last_status": (i, []),
        "nf_status_str": (cp, [i]),
        "nf_config_default": (i, [vp]),
        "nf_config_parse": (i, [vp, cp, ctypes.c_char_p, sz]),
        "nf_backend_host_create": (i, [ctypes.POINTER(vp), _u64, _u64]),
        "nf_backend_cuda_create": (i, [ctypes.POINTER(vp), i]),
        "nf_backend_destroy": (None, [vp]),
        "nf_pool_create": (i, [ctypes.POINTER(vp), vp, vp]),
        "nf_pool_create_from_string": (i, [ctypes.POINTER(vp), cp]),
        "nf_pool_destroy": (None, [vp]),
        "nf_alloc": (vp, [vp, sz, vp]),
        "nf_free": (i, [vp, vp]),
        "nf_trim": (i, [vp]),
        "nf_set_limit": (i, [vp, _u64]),
        "nf_pool_add_peer": (i, [vp, ctypes.c_int]),
        "nf_stats_get": (None, [vp, ctypes.POINTER(NfStats)]),
        "nf_stats_reset_peaks": (None, [vp]),
        "nf_pool_check": (i, [vp]),
        "nf_pool_config": (None, [vp, vp]),
        "nf_config_format": (i, [vp, ctypes.c_char_p, sz]),
        "nf_block_size": (sz, [vp, vp]),
        "nf_record_stream": (i, [vp, vp, vp]),
        "nf_stream_known": (i, [vp, vp]),
        "nf_torch_pool": (vp, [i]),
        # offload (issue 7)
        "nf_offload": (i, [vp, vp, vp, i]),
        "nf_prefetch": (i, [vp, vp, vp]),
        "nf_offload_wait": (i, [vp]),
        "nf_block_tiers": (i, [vp, vp, ctypes.POINTER(_u64)]),
        # c_void_p (not c_char_p) keeps the pointer so that the library can free it
        "nf_snapshot": (vp, [vp]),
        "nf_snapshot_free": (None, [vp]),
        "nf_torch_set_host_alloc": (sz, [sz]),
        # the C++ adapter's own library (nofrag.torch_adapter), declared through this same table
        "nf_adapter_install": (i, [ctypes.c_char_p, sz]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name, None)
        if fn is None:
            continue  # older build: the caller gets AttributeError where it matters
        fn.restype = res
        fn.argtypes = args


def declare(lib):
    """Declare the signatures on another library of the package (the C++
    adapter's), from the same table."""
    _declare(lib)
    return lib


def _open(cand):
    """ctypes.CDLL(cand) with its signatures declared; OSError if it fails."""
    lib = ctypes.CDLL(cand)
    _declare(lib)
    return lib


def load():
    """Load libnofrag.so once (see the module docstring for where). Raises
    LibraryError (a NofragError and an OSError) naming the path when
    $NOFRAG_LIB is wrong, or every place tried when nothing loads."""
    global _lib, _path
    lib = _lib
    if lib is not None:  # loaded: no lock needed to read it
        return lib
    with _lock:
        if _lib is not None:
            return _lib
        env = os.environ.get("NOFRAG_LIB")
        if env:
            # An explicit choice is never silently replaced by another copy.
            if not os.path.exists(env):
                raise LibraryError(f"nofrag: NOFRAG_LIB={env}: no such file (unset NOFRAG_LIB to use the "
                                   "library shipped with the package)", env)
            try:
                _lib = _open(env)
            except OSError as e:
                raise LibraryError(f"nofrag: NOFRAG_LIB={env}: cannot load it: {e}", env) from None
            _path = os.path.realpath(env)
            return _lib
        tried = []
        for cand in _candidates():
            if os.path.sep in cand and not os.path.exists(cand):
                tried.append(f"{cand} (missing)")
                continue
            try:
                lib = _open(cand)
            except OSError as e:
                tried.append(f"{cand} ({e})")
                continue
            _lib = lib
            # The real file: CUDAPluggableAllocator dlopens it again by path and
            # must get this same instance (glibc matches it by inode).
            _path = os.path.realpath(cand) if os.path.exists(cand) else cand
            return lib
        raise LibraryError(
            "nofrag: libnofrag.so not found. Install the package (pip install --no-build-isolation --no-index .), "
            "or build it (cmake -S . -B build && cmake --build build) and/or set NOFRAG_LIB=/path/to/libnofrag.so. "
            "Tried: " + "; ".join(tried or ["nothing"]))


def path():
    """Filesystem path of the loaded library."""
    load()
    return _path


def last_error():
    """The plug-in's last error on the calling thread (else any thread's), else the library's."""
    lib = load()
    msg = lib.nf_torch_last_error() or b""
    if not msg:
        msg = lib.nf_last_error() or b""
    return msg.decode(errors="replace")


def conf_string(**config):
    """Keyword arguments to a nofrag config string: limit="40GiB" -> "limit:40GiB".

    Integers are bytes; None values are skipped. Keys are checked by the C
    parser (nf_torch_configure) so this stays in step with src/core/config.c.
    ``spill=True`` / ``False`` become "spill:host" / "spill:off" (other keys
    take booleans as 1 / 0); ``spill_limit`` is a size and ``offload_dir`` a
    directory (like ``trace``, it cannot contain ',').
    """
    parts = []
    for k, v in config.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = ("host" if v else "off") if k == "spill" else int(v)
        v = str(v)
        if "," in v:
            raise ValueError(f"config value for {k!r} cannot contain ',': {v!r}")
        parts.append(f"{k}:{v}")
    return ",".join(parts)


def conf_join(conf, config, what):
    """`conf` (a config string or None) and keywords `config` (conf_string)
    as one config string ("" for neither). TypeError when `conf` is not a
    str, ValueError for a NUL character: the C parser would stop at it and
    silently drop the rest ("limit:1GiB\\0,spill:host" -> "limit:1GiB")."""
    if conf is not None and not isinstance(conf, str):
        raise TypeError(f"{what}: conf must be a config string such as 'limit:40GiB' (or None), "
                        f"not {type(conf).__name__}")
    s = ",".join(p for p in (conf, conf_string(**config)) if p)
    if "\0" in s:
        raise ValueError(f"{what}: the configuration contains a NUL character: {s!r}")
    return s
