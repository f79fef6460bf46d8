"""The C++ adapter (src/torch/adapter.h, adapter.cpp, adapter_trace.cpp): nofrag as a first-class PyTorch
allocator, compiled against the importable torch, offline, with the machine's
compiler (torch.utils.cpp_extension: g++, ninja, the CUDA headers of
CUDA_HOME).

``build_adapter(out_dir)`` compiles it (or finds it already built for this
torch and these sources) and returns ``(path, reason)``: the shared library's
path and "" on success, ``(None, why)`` otherwise (no torch, no compiler, an
older torch, a compile error: the log is in ``out_dir``). ``install()`` builds
it if needed and makes it PyTorch's CUDA allocator; nofrag.torch.enable() calls
it and falls back to the ctypes path (CUDAPluggableAllocator with the
plug-in's C functions) when it cannot, listing what the fallback lacks.

The cache is ``$NOFRAG_ADAPTER_DIR`` or ``~/.cache/nofrag/adapter``, one
directory per (torch version, CUDA version, sources hash), so a pip install
that already built it (packaging calls build_adapter) is reused.
"""
import ctypes
import hashlib
import os
import shutil
import sys
import tempfile

from . import _lib

# What the ctypes path (CUDAPluggableAllocator + C hooks) does not do, which
# the adapter does: printed when enable() has to fall back.
FALLBACK_MISSING = (
    "CUDA graphs / make_graphed_callables (private pools: memory freed during capture is reused "
    "outside the graph)", "torch.compile(mode='reduce-overhead') (checkPoolLiveAllocations)",
    "cudnn.benchmark (cacheInfo)", "_record_memory_history / _snapshot / _dump_snapshot",
    "torch.OutOfMemoryError (a RuntimeError is raised instead)", "MemPool / use_mem_pool",
    "CUDA IPC (torch.multiprocessing sharing of CUDA tensors)",
    "native memory_stats (patched in Python instead)")

_SOURCES = ("adapter.h", "adapter.cpp", "adapter_trace.cpp", "torch.h")
_COMPILED = ("adapter.cpp", "adapter_trace.cpp")


def _source_dir():
    """Directory holding the adapter's sources and torch.h (src/torch in a checkout,
    nofrag/csrc in an installed package, or $NOFRAG_SRC)."""
    here = os.path.dirname(os.path.abspath(__file__))
    cands = [os.environ.get("NOFRAG_SRC", ""), os.path.join(here, "csrc"),
             os.path.join(here, "..", "..", "src", "torch")]
    for c in cands:
        if c and all(os.path.exists(os.path.join(c, f)) for f in _SOURCES):
            return os.path.realpath(c)
    return None


def _include_dir(src):
    """Directory holding nofrag.h (include/ of a checkout, or next to the sources)."""
    for c in (os.path.join(src, "..", "..", "include"), src, os.path.join(src, "include")):
        if os.path.exists(os.path.join(c, "nofrag.h")):
            return os.path.realpath(c)
    return None


def cache_dir():
    return os.environ.get("NOFRAG_ADAPTER_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nofrag",
                                                                 "adapter")


def _tag(torch, src, inc):
    h = hashlib.sha256()
    for d, names in ((src, _SOURCES), (inc, ("nofrag.h",))):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                h.update(f.read())
    cuda = getattr(torch.version, "cuda", None) or "nocuda"
    return f"torch{torch.__version__}-cuda{cuda}-{h.hexdigest()[:12]}".replace("+", "_")


def _pip_cuda_runtime():
    """(include dir, lib dir, soversion) of the nvidia-cuda-runtime wheel torch
    depends on, or None."""
    try:
        import nvidia.cuda_runtime as rt  # noqa: F401 - the wheel torch's CUDA builds pull in
    except Exception:  # noqa: BLE001
        return None
    base = list(getattr(rt, "__path__", []))[:1]
    if not base:
        return None
    inc, lib = os.path.join(base[0], "include"), os.path.join(base[0], "lib")
    if not os.path.exists(os.path.join(inc, "cuda_runtime_api.h")) or not os.path.isdir(lib):
        return None
    for n in sorted(os.listdir(lib)):
        if n.startswith("libcudart.so."):
            return inc, lib, n[len("libcudart.so."):]
    return None


def _locate(out_dir):
    """Where the adapter for the importable torch and these sources is, or
    would be built: (built path or None, why not built, build context or
    None). Builds and creates nothing."""
    try:
        import torch
        import torch.utils.cpp_extension as cpp
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
        return None, f"torch is not importable ({e.__class__.__name__}: {e})", None
    src = _source_dir()
    if not src:
        return None, "the adapter's sources (%s) were not found; set NOFRAG_SRC" % ", ".join(_SOURCES), None
    inc = _include_dir(src)
    if not inc:
        return None, f"nofrag.h not found near {src}", None
    try:
        libpath = _lib.path()
    except OSError as e:
        return None, str(e), None
    tag = _tag(torch, src, inc)
    if out_dir is None:  # built by pip into the package (nofrag/_build.py)?
        shipped = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adapter", tag, "nofrag_adapter.so")
        if os.path.exists(shipped):
            return shipped, "", None
    out = os.path.join(out_dir or cache_dir(), tag)
    so = os.path.join(out, "nofrag_adapter.so")
    if os.path.exists(so):  # only ever a finished build: it is renamed into place (build_adapter)
        return so, "", None
    return None, f"not built yet for torch {torch.__version__} (it would go to {so})", (cpp, src, inc, libpath, out, so)


def built(out_dir=None):
    """The adapter already built for the importable torch and these sources:
    (path, "") or (None, why not). Builds nothing (nofrag doctor asks)."""
    path, why, _ = _locate(out_dir)
    return path, why


def build_adapter(out_dir=None, verbose=False):
    """Compile the adapter against the importable torch. Returns (path, "")
    or (None, reason). Offline: no download, only the local compiler."""
    path, why, ctx = _locate(out_dir)
    if path or ctx is None:
        return path, why
    cpp, src, inc, libpath, out, so = ctx
    os.makedirs(out, exist_ok=True)
    libdir = os.path.dirname(libpath)
    # Each process builds in its own directory and renames the result into
    # place: under torchrun every rank may build at once, and none may load
    # (or keep, after a killed build) a half-written nofrag_adapter.so.
    work = tempfile.mkdtemp(prefix=".build-", dir=out)
    log = os.path.join(work, "build.log")
    common = dict(name="nofrag_adapter", sources=[os.path.join(src, f) for f in _COMPILED],
                  # Hidden visibility: only the extern "C" entry points (marked default) are exported, so
                  # the adapter's copies of inline/template code (c10, std, CUDA headers) can never
                  # interpose on another library's (see install()).
                  extra_cflags=["-O2", "-fvisibility=hidden", "-fvisibility-inlines-hidden"],
                  is_python_module=False, build_directory=work, verbose=True)
    ld = [f"-L{libdir}", f"-l:{os.path.basename(libpath)}", f"-Wl,-rpath,{libdir}"]
    attempts = [dict(extra_include_paths=[inc, src], extra_ldflags=ld, with_cuda=True)]
    rt = _pip_cuda_runtime()
    if rt:  # no CUDA toolkit (CUDA_HOME): the CUDA runtime headers of the nvidia pip wheel
        attempts.append(dict(extra_include_paths=[inc, src, rt[0]],
                             extra_ldflags=ld + [f"-L{rt[1]}", "-l:libcudart.so.%s" % rt[2], f"-Wl,-rpath,{rt[1]}"],
                             with_cuda=False))
    built, errors = None, []
    # cpp_extension prints the compiler's output; keep it in build.log.
    old_out, old_err = os.dup(1), os.dup(2)
    try:
        with open(log, "w") as f:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            try:
                for extra in attempts:
                    try:
                        built = cpp.load(**common, **extra)
                        break
                    except Exception as e:  # noqa: BLE001 - compile errors: RuntimeError; no CUDA_HOME: OSError
                        errors.append(f"{e.__class__.__name__}: {str(e)[:300]}")
                        print(f"nofrag: adapter build attempt failed: {errors[-1]}", flush=True)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(old_out, 1)
                os.dup2(old_err, 2)
    finally:
        os.close(old_out)
        os.close(old_err)
    keep = os.path.join(out, "build.log")
    try:
        os.replace(log, keep)  # the latest build's log, whole
        log = keep
    except OSError:
        pass
    path = built if isinstance(built, str) and os.path.exists(built) else os.path.join(work, "nofrag_adapter.so")
    try:
        if built is None:
            return None, f"compiling the adapter failed ({'; '.join(errors)}); log: {log}"
        if not os.path.exists(path):
            return None, f"the adapter was built but {path} is missing; log: {log}"
        os.replace(path, so)  # atomic: another rank sees no file or a whole one
        return so, ""
    except OSError as e:
        return None, f"the adapter was built but could not be moved to {so}: {e}; log: {log}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def install(out_dir=None):
    """Build (if needed) and install the adapter as PyTorch's CUDA allocator.
    Returns (True, path) or (False, reason)."""
    path, why = build_adapter(out_dir)
    if not path:
        return False, why
    try:
        # RTLD_LOCAL, never RTLD_GLOBAL: a global load would put the adapter and its dependencies
        # (libtorch_python's pybind11, libtorch_cpu's bundled libraries) ahead of every library loaded
        # afterwards in symbol lookup; triton's own pybind11/LLVM then bound to torch's copies and
        # torch.compile failed inside make_llir ("returned NULL without setting an exception").
        lib = _lib.declare(ctypes.CDLL(path, mode=os.RTLD_LOCAL))
    except OSError as e:
        return False, f"loading {path} failed: {e}"
    err = ctypes.create_string_buffer(1024)
    if lib.nf_adapter_install(err, len(err)) != 0:
        return False, f"installing the adapter failed: {err.value.decode(errors='replace')}"
    return True, path
