"""Build-time hooks that setup.py runs (not used at run time).

setup.py loads this file by path (it does not import the nofrag package).

``build_torch_adapter`` is the hook for the PyTorch C++ adapter
(src/torch/adapter*.cpp, a separate piece of work): `pip install .` calls it
after libnofrag.so and the CLI are built. It is a no-op that returns the
reason when torch is not importable by the interpreter running the build
(build isolation would hide an installed torch: use --no-build-isolation) or
when this checkout has no adapter sources; otherwise it is where the adapter
gets compiled (e.g. with torch.utils.cpp_extension) into ``pkg_dir``.
"""

import glob
import importlib.util
import os


def build_torch_adapter(root, pkg_dir, build_temp, lib_path):
    """Build the PyTorch adapter into ``pkg_dir`` (the package being built).

    root: the source checkout; build_temp: a scratch directory; lib_path: the
    libnofrag.so just built (to link against). Returns (built_file, None) or
    (None, reason it was skipped)."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch is not importable here (install torch first and use --no-build-isolation)"
    sources = sorted(glob.glob(os.path.join(root, "src", "torch", "adapter*.cpp")))
    if not sources:
        return None, "no PyTorch adapter sources (src/torch/adapter*.cpp) in this checkout"
    # The adapter's build goes here (see the module docstring).
    return None, "building the PyTorch adapter is not implemented yet"
