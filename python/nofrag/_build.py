"""Build-time hooks that setup.py runs (not used at run time).

setup.py loads this file by path (it does not import the nofrag package).

``build_torch_adapter`` is the hook for the PyTorch C++ adapter
(src/torch/adapter*.cpp): `pip install .` calls it after libnofrag.so and the
CLI are built. It ships the adapter's sources in the package and, when torch is
importable by the interpreter running the build (build isolation would hide an
installed torch: use --no-build-isolation), compiles the adapter into the
package with nofrag.torch_adapter.build_adapter.
"""

import importlib
import importlib.util
import os
import shutil
import sys


ADAPTER_SOURCES = ("adapter.h", "adapter.cpp", "adapter_trace.cpp", "torch.h")


def build_torch_adapter(root, pkg_dir, build_temp, lib_path):
    """Ship the adapter's sources in the package (``nofrag/csrc``, so that an
    installed package can build it on first ``enable()``) and, when torch is
    importable, build it into ``pkg_dir/adapter`` (nofrag.torch_adapter looks
    there before its cache).

    root: the source checkout; build_temp: a scratch directory; lib_path: the
    libnofrag.so just built (to link against). Returns (built_file, None) or
    (None, reason it was skipped)."""
    src = os.path.join(root, "src", "torch")
    if not all(os.path.exists(os.path.join(src, f)) for f in ADAPTER_SOURCES):
        return None, "no PyTorch adapter sources (src/torch/adapter*.cpp) in this checkout"
    csrc = os.path.join(pkg_dir, "csrc")
    os.makedirs(csrc, exist_ok=True)
    for f in ADAPTER_SOURCES:
        shutil.copyfile(os.path.join(src, f), os.path.join(csrc, f))
    shutil.copyfile(os.path.join(root, "include", "nofrag.h"), os.path.join(csrc, "nofrag.h"))
    if importlib.util.find_spec("torch") is None:
        return None, ("torch is not importable here (sources shipped: the adapter is built on first "
                      "nofrag.torch.enable(); to build it now install torch first and use --no-build-isolation)")
    env, saved_path = dict(os.environ), list(sys.path)
    os.environ["NOFRAG_SRC"], os.environ["NOFRAG_LIB"] = csrc, lib_path
    try:
        sys.path.insert(0, os.path.dirname(pkg_dir))
        mod = importlib.import_module("nofrag.torch_adapter")
        path, why = mod.build_adapter(os.path.join(pkg_dir, "adapter"))
    finally:
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = saved_path
    return (path, None) if path else (None, why)
