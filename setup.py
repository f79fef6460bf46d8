"""pip install for nofrag (no pyproject.toml on purpose: its [build-system]
table makes pip fetch setuptools into an isolated build, which fails offline): the Python package with libnofrag.so and the
`nofrag` command inside it.

    pip install --no-index .                            # offline, this checkout (Debian 12's pip 23)
    pip install --no-build-isolation --no-index .      # the same with a pip that isolates builds by default
    pip wheel --no-build-isolation --no-index -w dist . # a wheel for machines with the same (or newer) glibc

Needs setuptools and wheel (Debian: python3-setuptools python3-wheel; use
/usr/bin/python3 or a venv made from it), cmake (>= 3.16) and a C compiler,
zlib headers (Debian: cmake build-essential zlib1g-dev). The C parts are built
by CMake (targets nofrag and nofrag_cli, tests off) in build-pip/cmake, then
copied into the package: nofrag/libnofrag.so (found by nofrag._lib without
NOFRAG_LIB) and nofrag/_bin/nofrag (run by the `nofrag` console script).
Then the PyTorch adapter hook runs (nofrag/_build.py: build_torch_adapter).
Environment: NOFRAG_CMAKE_ARGS adds arguments to the CMake configure step.

    pip install --no-index --no-build-isolation -e .   # editable: the package runs from python/nofrag

An editable install (legacy `setup.py develop`, Debian 12's pip, or PEP 660
with a newer one) builds the same two files into the checkout itself,
python/nofrag/libnofrag.so and python/nofrag/_bin/nofrag (both ignored by git):
Python edits take effect at once, C edits after another `pip install -e .`.
The sdist (`python3 setup.py sdist`) carries what the CMake build needs
(MANIFEST.in). A build directory configured from another source tree (a
copied checkout) is wiped and configured afresh.
"""

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

ROOT = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(ROOT, "build-pip"), exist_ok=True)  # setup.cfg's egg_base must exist


def version():
    """NF_VERSION from include/nofrag.h: the version's one home."""
    with open(os.path.join(ROOT, "include", "nofrag.h")) as f:
        m = re.search(r'^#define NF_VERSION "([^"]+)"', f.read(), re.M)
    if not m:
        sys.exit("setup.py: no '#define NF_VERSION \"X.Y.Z\"' in include/nofrag.h")
    return m.group(1)


def cache_source(build_dir):
    """The source directory a CMake build directory was configured from
    (CMAKE_HOME_DIRECTORY of its CMakeCache.txt), or None."""
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_HOME_DIRECTORY:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


def cmake_build(build_dir):
    """Configure and build libnofrag.so and the CLI; returns their paths."""
    cmake = shutil.which("cmake")
    if not cmake:
        sys.exit("setup.py: cmake not found on PATH: nofrag's C library is built with CMake "
                 "(Debian/Ubuntu: apt-get install cmake build-essential zlib1g-dev)")
    # A checkout copied with its build-pip/ carries a cache of the original
    # tree: CMake refuses it ("does not match the source ... used to generate
    # cache"). Start that build directory afresh.
    src = cache_source(build_dir)
    if src is not None and os.path.realpath(src) != os.path.realpath(ROOT):
        print(f"setup.py: {build_dir} was configured from {src}, not {ROOT}: removing it", flush=True)
        shutil.rmtree(build_dir)
    args = [cmake, "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DNF_TESTS=OFF"]
    args += shlex.split(os.environ.get("NOFRAG_CMAKE_ARGS", ""))
    jobs = str(os.cpu_count() or 1)
    for cmd in (args, [cmake, "--build", build_dir, "-j", jobs, "--target", "nofrag", "nofrag_cli"]):
        print("setup.py:", " ".join(shlex.quote(a) for a in cmd), flush=True)
        subprocess.run(cmd, check=True)
    lib, cli = os.path.join(build_dir, "libnofrag.so"), os.path.join(build_dir, "nofrag")
    for p in (lib, cli):
        if not os.path.exists(p):
            sys.exit(f"setup.py: the CMake build did not produce {p}")
    return lib, cli


def build_into_package(pkg, editable=False):
    """Build the C library and CLI and put them into the package directory
    `pkg`: the build's copy of it, or the checkout's python/nofrag for an
    editable install."""
    lib, cli = cmake_build(os.path.abspath(os.path.join(ROOT, "build-pip", "cmake")))
    shutil.copyfile(lib, os.path.join(pkg, "libnofrag.so"))  # the file, not the symlink
    os.makedirs(os.path.join(pkg, "_bin"), exist_ok=True)
    shutil.copyfile(cli, os.path.join(pkg, "_bin", "nofrag"))
    os.chmod(os.path.join(pkg, "_bin", "nofrag"), 0o755)
    if editable:
        # No _version.py (the package reads include/nofrag.h beside it) and
        # no nofrag/csrc copy of the adapter's sources (a stale copy would be
        # preferred to src/torch): the adapter is built from src/torch on
        # first nofrag.torch.enable().
        print("setup.py: editable install: libnofrag.so and _bin/nofrag built into " + pkg, flush=True)
        return
    with open(os.path.join(pkg, "_version.py"), "w") as f:
        f.write(f'# Written by setup.py from include/nofrag.h.\nversion = "{version()}"\n')
    # The PyTorch adapter hook (python/nofrag/_build.py), loaded by path:
    # importing the nofrag package here is not needed and could pick up
    # another installed copy.
    spec = importlib.util.spec_from_file_location("nofrag_build", os.path.join(ROOT, "python", "nofrag", "_build.py"))
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    built, why = hooks.build_torch_adapter(ROOT, pkg, os.path.join(ROOT, "build-pip", "torch"), lib)
    print(f"setup.py: PyTorch adapter: {built or 'skipped: ' + why}", flush=True)


class BuildWithLibrary(build_py):
    """build_py, plus the C library and CLI copied into the package. In a
    PEP 660 editable build (editable_mode) the package is the checkout's
    python/nofrag: the library goes there."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            build_into_package(os.path.join(ROOT, "python", "nofrag"), editable=True)
        else:
            build_into_package(os.path.join(self.build_lib, "nofrag"))


class DevelopWithLibrary(develop):
    """`setup.py develop` (pip install -e with a pip that does not use PEP
    660): link python/ into site-packages, with the C library and CLI built
    into python/nofrag. develop never runs build_py, and setup.cfg's egg_base
    (build-pip, for the other commands) would make the link point at
    build-pip: the egg-info goes beside the package instead (python/, ignored
    by git)."""

    def finalize_options(self):
        ei = self.reinitialize_command("egg_info")
        ei.egg_base = "python"
        super().finalize_options()

    def run(self):
        if not self.uninstall:
            build_into_package(os.path.join(ROOT, "python", "nofrag"), editable=True)
        super().run()


class BinaryDistribution(Distribution):
    """The package carries a native library: platform wheel, platlib install."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildWithLibrary, "develop": DevelopWithLibrary}
try:  # setuptools >= 70.1 has its own; older ones use the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None
if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        """py3-none-<platform>: the .so is loaded with ctypes, so any Python 3
        will do, but only on this platform (glibc of the build or newer)."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return "py3", "none", super().get_tag()[2]

    cmdclass["bdist_wheel"] = PlatformWheel
else:
    NO_WHEEL = ("nofrag: building a wheel needs the 'wheel' package, which this Python (" + sys.executable
                + ") lacks and an offline pip cannot fetch. Use a venv made from Debian's Python with its packages "
                "in view (apt-get install python3-wheel; /usr/bin/python3 -m venv --system-site-packages VENV), "
                "or install 'wheel' into this environment first")
    if "bdist_wheel" in sys.argv[1:]:  # an older pip's legacy `setup.py bdist_wheel -d DIR`
        sys.exit("error: " + NO_WHEEL)
    from setuptools import Command
    try:
        from setuptools.errors import ModuleError
    except ImportError:  # setuptools < 59
        from distutils.errors import DistutilsModuleError as ModuleError

    class NoWheel(Command):
        """Without it, pip's PEP 517 build (a newer pip, or --no-build-isolation)
        failed with "error: invalid command 'bdist_wheel'", naming no cause."""

        user_options = []

        def initialize_options(self):
            pass

        def finalize_options(self):  # pip's metadata step finalizes it, never running it
            raise ModuleError(NO_WHEEL)

        def run(self):
            pass

    cmdclass["bdist_wheel"] = NoWheel

setup(
    name="nofrag",
    version=version(),
    description="GPU memory allocator that does not fragment (CUDA VMM; PyTorch and CuPy plug-ins)",
    long_description=open(os.path.join(ROOT, "README.md")).read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.8",
    package_dir={"": "python"},
    packages=["nofrag"],
    entry_points={"console_scripts": ["nofrag = nofrag._cli:main"]},
    cmdclass=cmdclass,
    distclass=BinaryDistribution,
    zip_safe=False,
    classifiers=["License :: OSI Approved :: MIT License", "Programming Language :: C",
                 "Programming Language :: Python :: 3", "Operating System :: POSIX :: Linux"],
)
