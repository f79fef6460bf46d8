"""nofrag.Pool (a pool of one's own, no torch) and loading the library.

    NOFRAG_LIB=build/libnofrag.so python3 -m unittest discover -s python/tests -v

Runs from the checkout (ctest: NOFRAG_LIB set) and against an installed
package (scripts/test-install.sh: tests copied out of the checkout, no
NOFRAG_LIB: the library shipped in the package).
"""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

import nofrag  # noqa: E402
from nofrag import _lib  # noqa: E402

MiB = 1 << 20
CONF = "backend:host,limit:256MiB"


def run_python(code, **env_changes):
    """`python -c code` with this test's nofrag importable and env changed
    (a value None unsets the variable)."""
    env = dict(os.environ)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(nofrag.__file__)))
    env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


class TestPool(unittest.TestCase):
    def test_alloc_write_free(self):
        import ctypes
        with nofrag.Pool(CONF) as pool:
            p = pool.alloc(3 * MiB)
            self.assertIsInstance(p, int)
            self.assertEqual(p % 512, 0)
            ctypes.memset(p, 0x5A, 3 * MiB)  # host backend: ordinary memory
            self.assertEqual(ctypes.string_at(p + 3 * MiB - 4, 4), b"\x5a" * 4)
            self.assertEqual(pool.block_size(p), 3 * MiB)
            st = pool.stats()
            self.assertEqual(st["live"], 3 * MiB)
            self.assertEqual(st["limit"], 256 * MiB)
            pool.free(p)
            st = pool.stats()
            self.assertEqual((st["live"], st["allocs"], st["frees"]), (0, 1, 1))
            pool.check()

    def test_keywords_and_string(self):
        with nofrag.Pool("backend:host", limit="64MiB", granule=4 * MiB) as pool:
            self.assertIn("limit:67108864", pool.config())
            self.assertIn(f"granule:{4 * MiB}", pool.config())
            self.assertIn("backend:host", pool.config())

    def test_double_free_raises(self):
        with nofrag.Pool(CONF) as pool:
            p = pool.alloc(MiB)
            pool.free(p)
            with self.assertRaises(nofrag.NofragError) as cm:
                pool.free(p)
            self.assertEqual(cm.exception.status_name, "NF_ERR_INVALID")
            self.assertIn("double free", str(cm.exception))
            self.assertEqual(pool.stats()["frees"], 1)  # nothing changed

    def test_add_peer_on_host_backend_is_unsupported(self):
        with nofrag.Pool(CONF) as pool:
            with self.assertRaises(nofrag.NofragError) as cm:
                pool.add_peer(1)
            self.assertEqual(cm.exception.status_name, "NF_ERR_UNSUPPORTED")
            self.assertIn("no peer devices", str(cm.exception))

    def test_interior_pointer_free_raises(self):
        with nofrag.Pool(CONF) as pool:
            p = pool.alloc(MiB)
            with self.assertRaises(nofrag.NofragError):
                pool.free(p + 512)
            pool.free(p)

    def test_oom_raises_with_is_oom(self):
        os.environ.setdefault("NOFRAG_QUIET_OOM", "1")  # the report on stderr is not the point here
        with nofrag.Pool("backend:host,limit:8MiB") as pool:
            with self.assertRaises(nofrag.NofragError) as cm:
                pool.alloc(64 * MiB)
            self.assertTrue(cm.exception.is_oom)
            self.assertEqual(cm.exception.status_name, "NF_ERR_OOM")

    def test_bad_config_raises_naming_key(self):
        with self.assertRaises(nofrag.NofragError) as cm:
            nofrag.Pool("backend:host,limitt:1GiB")
        self.assertEqual(cm.exception.status_name, "NF_ERR_CONFIG")
        self.assertIn("limitt", str(cm.exception))

    def test_context_manager_closes(self):
        with nofrag.Pool(CONF) as pool:
            pool.alloc(MiB)  # live blocks are dropped with the pool
        self.assertTrue(pool.closed)
        with self.assertRaises(nofrag.NofragError):
            pool.alloc(MiB)
        with self.assertRaises(nofrag.NofragError):
            pool.stats()
        pool.close()  # twice: no-op

    def test_zero_and_negative_sizes(self):
        with nofrag.Pool(CONF) as pool:
            self.assertEqual(pool.alloc(0), 0)
            with self.assertRaises(ValueError):
                pool.alloc(-1)
            pool.free(0)  # NULL: no-op

    def test_snapshot(self):
        with nofrag.Pool(CONF) as pool:
            p = pool.alloc(MiB)
            snap = pool.snapshot()
            self.assertEqual(snap["totals"]["live"], MiB)
            blocks = [b for c in snap["chunks"] for b in c["blocks"] if b.get("state", "live") == "live"]
            self.assertTrue(any(int(b["addr"], 16) == p for b in blocks), blocks)
            pool.free(p)

    def test_offload_prefetch_host_tier(self):
        with nofrag.Pool(CONF + ",spill:host") as pool:
            import ctypes
            p = pool.alloc(4 * MiB)
            ctypes.memset(p, 0x33, 4 * MiB)
            pool.offload(p, tier="host")
            pool.wait()
            self.assertEqual(pool.block_tiers(p)["host"], 4 * MiB)
            pool.prefetch(p)
            pool.wait()
            self.assertEqual(pool.block_tiers(p)["device"], 4 * MiB)
            self.assertEqual(ctypes.string_at(p + 4 * MiB - 1, 1), b"\x33")
            pool.free(p)

    def test_module_functions_take_a_pool(self):
        with nofrag.Pool(CONF) as pool:
            p = pool.alloc(MiB)
            self.assertEqual(nofrag.pool_stats(pool)["live"], MiB)
            self.assertEqual(nofrag.snapshot(pool)["totals"]["live"], MiB)
            pool.free(p)


class TestLibrary(unittest.TestCase):
    def test_version_is_the_headers(self):
        self.assertRegex(nofrag.__version__, r"^\d+\.\d+\.\d+$")

    def test_signatures_declared_in_lib_only(self):
        """_lib._declare is the one place: no other module sets argtypes."""
        pkg = os.path.dirname(os.path.abspath(nofrag.__file__))
        for name in os.listdir(pkg):
            if name.endswith(".py") and name != "_lib.py":
                with open(os.path.join(pkg, name)) as f:
                    src = f.read()
                self.assertNotIn(".argtypes", src, name)
                self.assertNotIn(".restype", src, name)

    def test_wrong_nofrag_lib_missing_file(self):
        bad = os.path.join(tempfile.gettempdir(), "no-such-dir-nofrag", "libnofrag.so")
        r = run_python("import nofrag\ntry:\n nofrag.Pool('backend:host')\nexcept nofrag.NofragError as e:\n"
                       " print('ERR', type(e).__name__, isinstance(e, OSError), e.path)\n", NOFRAG_LIB=bad)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), f"ERR LibraryError True {bad}")

    def test_wrong_nofrag_lib_not_a_library(self):
        with tempfile.NamedTemporaryFile(suffix=".so") as f:
            f.write(b"not an ELF file")
            f.flush()
            r = run_python("import nofrag\nnofrag.load()", NOFRAG_LIB=f.name)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(f"NOFRAG_LIB={f.name}", r.stderr)
            self.assertIn("LibraryError", r.stderr)

    def test_library_found_without_nofrag_lib(self):
        """Installed package: the bundled copy; checkout: build/libnofrag.so.
        Skipped when neither exists (a build directory elsewhere)."""
        pkg = os.path.dirname(os.path.abspath(nofrag.__file__))
        cands = [os.path.join(pkg, "libnofrag.so"), os.path.join(pkg, "..", "..", "build", "libnofrag.so")]
        if not any(os.path.exists(c) for c in cands):
            self.skipTest("no libnofrag.so in the package or ../../build")
        r = run_python("import nofrag\nwith nofrag.Pool('backend:host,limit:64MiB') as p:\n"
                       " p.free(p.alloc(1 << 20))\nprint(nofrag._lib.path())", NOFRAG_LIB=None)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.strip().endswith("libnofrag.so") or ".so." in r.stdout, r.stdout)

    def candidates_of_copy(self, root, files=None):
        """nofrag._lib._candidates() of a copy of the package's .py files at
        ROOT/python/nofrag (plus FILES: name -> text), run in a subprocess."""
        pkg = os.path.dirname(os.path.abspath(nofrag.__file__))
        dst = os.path.join(root, "python", "nofrag")
        os.makedirs(dst)
        for name in os.listdir(pkg):
            if name.endswith(".py") and name != "_version.py":
                with open(os.path.join(pkg, name)) as f, open(os.path.join(dst, name), "w") as g:
                    g.write(f.read())
        for name, text in (files or {}).items():
            with open(os.path.join(dst, name), "w") as g:
                g.write(text)
        r = subprocess.run([sys.executable, "-c", "from nofrag import _lib\nfor c in _lib._candidates(): print(c)"],
                           env=dict(os.environ, PYTHONPATH=os.path.join(root, "python")), capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.split("\n")

    def test_build_dir_only_in_a_source_checkout(self):
        """../../build/libnofrag.so is a candidate only where ../.. is a
        checkout (CMakeLists.txt, include/nofrag.h): a package copied
        elsewhere must not load whatever build/ sits there."""
        with tempfile.TemporaryDirectory() as root:
            build_lib = os.path.join(root, "build", "libnofrag.so")
            os.makedirs(os.path.dirname(build_lib))
            open(build_lib, "w").close()
            self.assertNotIn(build_lib, self.candidates_of_copy(root))
        with tempfile.TemporaryDirectory() as root:
            for f in ("CMakeLists.txt", os.path.join("include", "nofrag.h")):
                os.makedirs(os.path.dirname(os.path.join(root, f)), exist_ok=True)
                open(os.path.join(root, f), "w").close()
            self.assertIn(os.path.join(root, "build", "libnofrag.so"), self.candidates_of_copy(root))

    def test_install_libdir_from_version_module(self):
        """A cmake --install copy finds PREFIX/LIBDIR (lib64, lib/<multiarch>)
        through _version.libdir, relative to the package; without it, no
        PREFIX/lib guess."""
        with tempfile.TemporaryDirectory() as root:
            cands = self.candidates_of_copy(root, {"_version.py": 'version = "0.0.0"\nlibdir = "../../lib64"\n'})
            self.assertIn(os.path.join(root, "lib64", "libnofrag.so"), cands)
        with tempfile.TemporaryDirectory() as root:
            cands = self.candidates_of_copy(root)
            self.assertFalse([c for c in cands if c.startswith(root) and not c.startswith(os.path.join(root, "python"))],
                             cands)


if __name__ == "__main__":
    unittest.main()
