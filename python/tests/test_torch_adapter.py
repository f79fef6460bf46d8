"""The C++ adapter's Python side without torch (CI machines): build_adapter
finds the sources and says plainly why it cannot build here; enable()'s
fallback list is there. With torch importable these checks are skipped (the
GPU script bench/gpu/torch_features.py builds and exercises the adapter)."""
import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nofrag import torch_adapter  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None


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


if __name__ == "__main__":
    unittest.main()
