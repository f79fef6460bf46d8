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
import threading
import time
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

    def test_configure_error_lists_every_key(self):
        # The plug-in cut the unknown-key message at 256 bytes: the list of
        # valid keys lost its end ("..., release_idle_ms, units, edges" and no ")").
        with self.assertRaises(ValueError) as cm:
            nofrag.configure("bogus:1")
        self.assertIn("unknown key 'bogus'", str(cm.exception))
        self.assertIn("release_idle_ms, units, edges)", str(cm.exception))

    def test_config_not_a_string_or_with_nul(self):
        # A NUL cut the string at the C parser: "limit:1GiB\0,limitt:1" made a
        # pool with limit 1GiB and no error; Pool(123) raised "sequence item 0:
        # expected str instance, int found".
        with self.assertRaises(ValueError) as cm:
            nofrag.Pool("backend:host,limit:64MiB\0,limitt:1")
        self.assertIn("NUL", str(cm.exception))
        with self.assertRaises(ValueError):
            nofrag.Pool("backend:host", trace="/tmp/x\0y")
        with self.assertRaises(ValueError):
            nofrag.configure("limit:1GiB\0")
        for bad in (123, b"backend:host", ["backend:host"]):
            with self.assertRaises(TypeError) as cm:
                nofrag.Pool(bad)
            self.assertIn("conf must be a config string", str(cm.exception))
        with nofrag.Pool(CONF) as pool:  # still fine
            self.assertIn("limit:268435456", pool.config())

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


class _Index:
    """An integer type that is not int (numpy's np.int64 is one)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def _free_bad_pointer(_):
    """In a worker process: a library failure (NofragError) to send back."""
    with nofrag.Pool(CONF) as pool:
        pool.free(0x1234)


class TestPoolClose(unittest.TestCase):
    """close() from one thread while another is inside a library call on the
    pool: the destroy waits for the call (it was a heap-use-after-free in C:
    nf_pool_destroy ran during nf_alloc)."""

    def patch(self, name, fn):
        lib = _lib.load()
        real = getattr(lib, name)
        setattr(lib, name, fn)
        self.restore.append((lib, name, real))
        return real

    def close_during(self, fn_name, call, prepare=None):
        self.restore = []
        try:
            self._close_during(fn_name, call, prepare)
        finally:
            for lib, name, real in reversed(self.restore):
                setattr(lib, name, real)

    def _close_during(self, fn_name, call, prepare):
        pool = nofrag.Pool(CONF + ",spill:host")
        self.addCleanup(pool.close)
        arg = prepare(pool) if prepare else None
        inside, release = threading.Event(), threading.Event()
        destroyed, bad = [], []

        def slow(*a):
            inside.set()
            release.wait(10)
            if destroyed:  # the old code: the pool is gone; calling C now would be a use-after-free
                bad.append(fn_name)
                return None
            return real(*a)

        real = self.patch(fn_name, slow)
        real_destroy = self.patch("nf_pool_destroy", lambda h: (destroyed.append(h), real_destroy(h)))
        result = []

        def user():
            try:
                result.append(call(pool, arg))
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                result.append(e)

        t = threading.Thread(target=user)
        t.start()
        self.assertTrue(inside.wait(10), fn_name)
        pool.close()
        try:
            self.assertEqual(destroyed, [], f"{fn_name}: close() destroyed the pool during the call")
            self.assertTrue(pool.closed)
            with self.assertRaises(nofrag.NofragError):  # no new calls once closing
                pool.stats()
            pool.close()  # twice: still a no-op
        finally:
            release.set()
            t.join(10)
        self.assertEqual(bad, [])
        self.assertEqual(len(destroyed), 1, fn_name)  # the call in flight destroyed it on its way out
        self.assertNotIsInstance(result[0], Exception, fn_name)
        with self.assertRaises(nofrag.NofragError):
            pool.alloc(MiB)

    def test_close_waits_for_calls_in_flight(self):
        def alloc_one(pool):
            return pool.alloc(MiB)
        cases = [
            ("nf_alloc", lambda p, _: p.alloc(4096), None),
            ("nf_free", lambda p, a: p.free(a), alloc_one),
            ("nf_block_size", lambda p, a: p.block_size(a), alloc_one),
            ("nf_record_stream", lambda p, a: p.record_stream(a, 0), alloc_one),
            ("nf_stats_get", lambda p, _: p.stats(), None),
            ("nf_stats_get", lambda p, _: nofrag.pool_stats(p), None),
            ("nf_snapshot", lambda p, _: p.snapshot(), None),
            ("nf_snapshot", lambda p, _: nofrag.snapshot(p), None),
            ("nf_pool_config", lambda p, _: p.config(), None),
            ("nf_pool_check", lambda p, _: p.check(), None),
            ("nf_trim", lambda p, _: p.trim(), None),
            ("nf_set_limit", lambda p, _: p.set_limit(128 * MiB), None),
            ("nf_offload", lambda p, a: p.offload(a), alloc_one),
            ("nf_offload_wait", lambda p, _: p.wait(), None),
            ("nf_block_tiers", lambda p, a: p.block_tiers(a), alloc_one),
        ]
        for fn_name, call, prepare in cases:
            with self.subTest(fn_name):
                self.close_during(fn_name, call, prepare)

    def test_close_while_threads_allocate(self):
        """The auditor's repro, bounded: every thread stops with 'closed'."""
        for _ in range(20):
            pool = nofrag.Pool("backend:host,limit:64MiB")
            errs = []

            def worker():
                try:
                    for _ in range(100000):
                        a = pool.alloc(4096)
                        pool.free(a)
                except nofrag.NofragError as e:
                    errs.append(e)

            ts = [threading.Thread(target=worker) for _ in range(2)]
            for t in ts:
                t.start()
            time.sleep(0.002)
            pool.close()
            for t in ts:
                t.join(60)
            self.assertTrue(pool.closed)
            for e in errs:
                self.assertIn("closed", str(e))


class TestArguments(unittest.TestCase):
    """Sizes, addresses, handles and devices out of range or of the wrong
    type: ctypes used to wrap them silently (2**64 + 4096 -> 4096)."""

    def setUp(self):
        self.pool = nofrag.Pool(CONF + ",spill:host")
        self.addCleanup(self.pool.close)

    def test_alloc_size(self):
        pool = self.pool
        for bad in (2 ** 64 + 4096, 2 ** 80, -1):
            with self.assertRaises(ValueError, msg=bad) as cm:
                pool.alloc(bad)
            self.assertIn("size", str(cm.exception))
        for bad in (1.7, 4096.0, True, "4096", None):
            with self.assertRaises(TypeError, msg=repr(bad)):
                pool.alloc(bad)
        self.assertEqual(pool.stats()["allocs"], 0)
        p = pool.alloc(_Index(4096))  # integer types that are not int (numpy's) are fine
        self.assertEqual(pool.block_size(p), 4096)
        pool.free(p)

    def test_pointers(self):
        pool = self.pool
        p = pool.alloc(MiB)
        for bad in (2 ** 64 + p, -1, -p):
            for call in (pool.free, pool.block_size, lambda x: pool.record_stream(x, None),
                         pool.offload, pool.prefetch, pool.block_tiers,
                         lambda x: nofrag.offload(pool, x), lambda x: nofrag.block_tiers(pool, x)):
                with self.assertRaises(ValueError, msg=bad):
                    call(bad)
        for bad in (1.5, float(p), True):
            with self.assertRaises(TypeError, msg=repr(bad)):
                pool.free(bad)
        self.assertEqual(pool.block_size(p), MiB)  # still live: nothing was freed
        self.assertEqual(pool.stats()["frees"], 0)
        pool.free(p)

    def test_streams(self):
        import types
        p = self.pool.alloc(MiB)
        for bad in (2 ** 64, -1, types.SimpleNamespace(ptr=-1), types.SimpleNamespace(cuda_stream=2 ** 64 + 1)):
            with self.assertRaises(ValueError, msg=repr(bad)):
                self.pool.record_stream(p, bad)
            with self.assertRaises(ValueError, msg=repr(bad)):
                self.pool.alloc(MiB, stream=bad)
        with self.assertRaises(TypeError):
            self.pool.alloc(MiB, stream=1.5)
        self.pool.free(p)
        with self.assertRaises(ValueError):
            nofrag.offload(2 ** 64, 4096)  # pool handles too

    def test_set_limit(self):
        pool = self.pool
        for bad in (2 ** 64 + 1, -1):
            with self.assertRaises(ValueError, msg=bad):
                pool.set_limit(bad)
        for bad in (1.5, True):
            with self.assertRaises(TypeError, msg=repr(bad)):
                pool.set_limit(bad)
        self.assertEqual(pool.stats()["limit"], 256 * MiB)
        pool.set_limit(128 * MiB)
        self.assertEqual(pool.stats()["limit"], 128 * MiB)

    def test_devices(self):
        for call in (nofrag.stats, nofrag.counters, self.pool.add_peer):
            for bad in (2 ** 32, 2 ** 31, -2 ** 31 - 1):
                with self.assertRaises(ValueError, msg=(call, bad)):
                    call(bad)
            for bad in (0.0, True):
                with self.assertRaises(TypeError, msg=(call, bad)):
                    call(bad)
        with self.assertRaises(TypeError):
            nofrag.snapshot(device=1.0)
        self.assertIn("pool", nofrag.stats(0))  # a real device index still works

    def test_tier_bool_is_not_a_tier(self):
        p = self.pool.alloc(MiB)
        with self.assertRaises(ValueError):
            self.pool.offload(p, tier=True)  # == 1 == host
        self.pool.free(p)


class TestSnapshotArguments(unittest.TestCase):
    def test_null_handle_is_an_error_not_the_plugins_pool(self):
        import ctypes
        for null in (ctypes.c_void_p(), 0):
            with self.assertRaises(ValueError, msg=repr(null)) as cm:
                nofrag.snapshot(null)
            self.assertIn("NULL", str(cm.exception))

    def test_failure_reports_this_threads_error(self):
        # nf_snapshot returning NULL: the message is the library's own
        # (nf_last_error), not the PyTorch plug-in's (another thread's maybe).
        lib = _lib.load()
        with nofrag.Pool(CONF) as pool:
            real_snap, real_torch = lib.nf_snapshot, lib.nf_torch_last_error
            lib.nf_snapshot = lambda h: real_snap(None)  # fails: NULL pool, nf_last_error set
            lib.nf_torch_last_error = lambda: b"someone else's torch error"
            try:
                with self.assertRaises(MemoryError) as cm:
                    nofrag.snapshot(pool)
            finally:
                lib.nf_snapshot, lib.nf_torch_last_error = real_snap, real_torch
        self.assertNotIn("someone else", str(cm.exception))
        self.assertTrue(str(cm.exception))


class TestErrorPickling(unittest.TestCase):
    def test_nofrag_error_pickles_and_copies(self):
        import copy
        import pickle
        with nofrag.Pool(CONF) as pool:
            with self.assertRaises(nofrag.NofragError) as cm:
                pool.free(0x1234)
        e = cm.exception
        for e2 in (pickle.loads(pickle.dumps(e)), copy.copy(e), copy.deepcopy(e)):
            self.assertIs(type(e2), nofrag.NofragError)
            self.assertEqual((e2.what, e2.status, e2.status_name, e2.detail, str(e2)),
                             (e.what, e.status, e.status_name, e.detail, str(e)))

    def test_library_error_pickles(self):
        import pickle
        e = nofrag.LibraryError("nofrag: NOFRAG_LIB=/x: no such file", "/x")
        e2 = pickle.loads(pickle.dumps(e))
        self.assertIs(type(e2), nofrag.LibraryError)
        self.assertEqual((e2.path, e2.detail, str(e2), e2.status), (e.path, e.detail, str(e), e.status))
        self.assertIsInstance(e2, OSError)

    def test_error_crosses_a_process_pool(self):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as ex:
            with self.assertRaises(nofrag.NofragError) as cm:  # was BrokenProcessPool
                ex.submit(_free_bad_pointer, 0).result(60)
        self.assertEqual(cm.exception.status_name, "NF_ERR_INVALID")


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

    def test_newer_library_first_in_a_checkout(self):
        """In a checkout, an editable install's copy in the package directory
        and a later cmake --build's build/libnofrag.so: the newer is tried
        first (the copy shadowed every rebuild before)."""
        for newer in ("build", "package"):
            with tempfile.TemporaryDirectory() as root:
                for f in ("CMakeLists.txt", os.path.join("include", "nofrag.h"), os.path.join("build", "libnofrag.so")):
                    os.makedirs(os.path.dirname(os.path.join(root, f)), exist_ok=True)
                    open(os.path.join(root, f), "w").close()
                built = os.path.join(root, "build", "libnofrag.so")
                t = time.time() + (1000 if newer == "build" else -1000)
                os.utime(built, (t, t))
                cands = self.candidates_of_copy(root, {"libnofrag.so": ""})
                bundled = os.path.join(root, "python", "nofrag", "libnofrag.so")
                self.assertEqual(cands.index(built) < cands.index(bundled), newer == "build", (newer, cands))

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
