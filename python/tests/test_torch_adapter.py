"""The C++ adapter's Python side without torch (CI machines): build_adapter
finds the sources and says plainly why it cannot build here; enable()'s
fallback list is there. With torch importable these checks are skipped (the
GPU script bench/gpu/torch_features.py builds and exercises the adapter)."""
import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nofrag import torch_adapter  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None



def fake_torch(load):
    """sys.modules patched with a minimal torch whose cpp_extension.load is `load`."""
    cpp = types.ModuleType("torch.utils.cpp_extension")
    cpp.load = load
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+fake"
    torch.version = types.SimpleNamespace(cuda="13.0")
    utils = types.ModuleType("torch.utils")
    utils.cpp_extension = cpp
    torch.utils = utils
    return mock.patch.dict(sys.modules, {"torch": torch, "torch.utils": utils, "torch.utils.cpp_extension": cpp})

class AdapterWithoutTorch(unittest.TestCase):
    def test_sources_found(self):
        src = torch_adapter._source_dir()
        self.assertIsNotNone(src)
        self.assertTrue(os.path.exists(os.path.join(src, "adapter.cpp")))
        self.assertIsNotNone(torch_adapter._include_dir(src))

    @unittest.skipIf(HAVE_TORCH, "torch is importable here: the GPU script covers the build")
    def test_build_says_why(self):
        path, why = torch_adapter.build_adapter(out_dir=os.path.join("/tmp", f"nofrag-adapter-test-{os.getpid()}"))
        self.assertIsNone(path)
        self.assertIn("torch is not importable", why)
        print(f"adapter skipped here: {why}")

    @unittest.skipIf(HAVE_TORCH, "torch is importable here")
    def test_install_falls_back(self):
        ok, why = torch_adapter.install(out_dir=os.path.join("/tmp", f"nofrag-adapter-test-{os.getpid()}"))
        self.assertFalse(ok)
        self.assertIn("torch", why)

    def test_fallback_list(self):
        joined = " ".join(torch_adapter.FALLBACK_MISSING)
        for feature in ("CUDA graphs", "cacheInfo", "OutOfMemoryError", "MemPool"):
            self.assertIn(feature, joined)


class AdapterLoading(unittest.TestCase):
    """How the adapter is compiled and loaded (no torch needed: fakes)."""

    @unittest.skipIf(shutil.which("cc") is None, "no C compiler")
    def test_loaded_local(self):
        # A stand-in adapter exporting a probe symbol: after install() the
        # probe must not be visible process-wide (RTLD_LOCAL). Loaded
        # RTLD_GLOBAL, the adapter and its dependencies interposed on
        # libraries loaded later (triton's pybind11 failed under torch.compile).
        d = tempfile.mkdtemp(prefix="nofrag-fake-adapter-")
        c, so = os.path.join(d, "a.c"), os.path.join(d, "nofrag_adapter.so")
        with open(c, "w") as f:
            f.write("#include <stddef.h>\nint nofrag_probe_global_7f3a(void) { return 7; }\n"
                    "int nf_adapter_install(char *e, size_t n) { (void)e; (void)n; return 0; }\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", so, c], check=True)
        with mock.patch.object(torch_adapter, "build_adapter", return_value=(so, "")):
            ok, path = torch_adapter.install(out_dir=d)
        self.assertTrue(ok, path)
        with self.assertRaises(AttributeError):
            ctypes.CDLL(None).nofrag_probe_global_7f3a  # noqa: B018 - the look-up is the test
        shutil.rmtree(d, ignore_errors=True)

    @unittest.skipIf(HAVE_TORCH, "torch is importable here: the fakes would shadow it")
    def test_compiled_hidden(self):
        seen = {}

        def load(**kw):
            seen.update(kw)
            raise RuntimeError("fake compiler")
        d = tempfile.mkdtemp(prefix="nofrag-fake-build-")
        with fake_torch(load):
            path, why = torch_adapter.build_adapter(out_dir=d)
        shutil.rmtree(d, ignore_errors=True)
        self.assertIsNone(path)
        self.assertIn("fake compiler", why)
        self.assertIn("-fvisibility=hidden", seen.get("extra_cflags", []))
        self.assertIn("-fvisibility-inlines-hidden", seen.get("extra_cflags", []))

    @unittest.skipIf(HAVE_TORCH, "torch is importable here: the fakes would shadow it")
    def test_build_lands_whole_or_not_at_all(self):
        # Ranks of one job may build at once: each builds in its own
        # directory and renames the finished library into place, so the cache
        # never holds a half-written nofrag_adapter.so, even after a failure.
        dirs, fail = [], [True]

        def load(**kw):
            dirs.append(kw["build_directory"])
            out = os.path.join(kw["build_directory"], "nofrag_adapter.so")
            with open(out, "wb") as f:
                f.write(b"partial")  # what a killed or failed link leaves
            print("compiler output", flush=True)
            if fail[0]:
                raise RuntimeError("fake link error")
            return out
        d = tempfile.mkdtemp(prefix="nofrag-fake-build-")
        self.addCleanup(shutil.rmtree, d, True)
        with fake_torch(load):
            path, why = torch_adapter.build_adapter(out_dir=d)
            self.assertIsNone(path)
            self.assertIn("fake link error", why)
            (tag,) = os.listdir(d)
            self.assertEqual(sorted(os.listdir(os.path.join(d, tag))), ["build.log"])  # no library, no work dir
            with open(os.path.join(d, tag, "build.log")) as f:
                self.assertIn("compiler output", f.read())
            fail[0] = False
            path, why = torch_adapter.build_adapter(out_dir=d)
            self.assertEqual(path, os.path.join(d, tag, "nofrag_adapter.so"), why)
            self.assertEqual(sorted(os.listdir(os.path.join(d, tag))), ["build.log", "nofrag_adapter.so"])
            self.assertNotEqual(dirs[0], dirs[1])  # a directory of its own each time
            self.assertTrue(all(os.path.dirname(x) == os.path.join(d, tag) for x in dirs))
            n = len(dirs)
            self.assertEqual(torch_adapter.build_adapter(out_dir=d), (path, ""))  # cached: no build
            self.assertEqual(len(dirs), n)


if __name__ == "__main__":
    unittest.main()


class EnableChecksTheEnvironment(unittest.TestCase):
    """enable() without arguments parses $NOFRAG_CONF at once: a typo there
    used to surface only at the first CUDA allocation, as a failed pool."""

    @unittest.skipIf(HAVE_TORCH, "a real torch is importable here")
    def test_bad_nofrag_conf_fails_at_enable(self):
        import nofrag.torch as nt
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False)
        with mock.patch.dict(sys.modules, {"torch": torch}), \
                mock.patch.dict(os.environ, {"NOFRAG_CONF": "backend:host,limitt:1GiB"}):
            with self.assertRaises(ValueError) as cm:
                nt.enable()
        self.assertIn("$NOFRAG_CONF", str(cm.exception))
        self.assertIn("limitt", str(cm.exception))
        self.assertFalse(nt._state["enabled"])
