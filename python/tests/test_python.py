"""Tests of the Python package without a GPU (plain unittest).

    NOFRAG_LIB=build/libnofrag.so python3 -m unittest discover -s python/tests -v

The plug-in entry points (nf_torch_*) are exercised on the host backend
("backend:host" in the configuration), which mirrors CUDA VMM semantics on
memfd + mmap; torch-specific parts are skipped when torch is absent.
"""

import ctypes
import os
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

import nofrag  # noqa: E402
import nofrag.torch as nft  # noqa: E402
from nofrag import _lib  # noqa: E402

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

MiB = 1 << 20
GiB = 1 << 30
HOST_CONF = "backend:host,host_capacity:1GiB,limit:64MiB,granule:2MiB"


class TestLayout(unittest.TestCase):
    def test_struct_size_matches_library(self):
        lib = nofrag.load()
        self.assertEqual(ctypes.sizeof(nofrag.NfStats), lib.nf_stats_size())

    def test_every_field_offset_matches(self):
        lib = nofrag.load()
        for name, _ in nofrag.NfStats._fields_:
            off = getattr(nofrag.NfStats, name).offset
            self.assertEqual(off, lib.nf_stats_offset(name.encode()), name)
        base = nofrag.NfStats.calls.offset
        for name, _ in _lib.NfCalls._fields_:
            off = base + getattr(_lib.NfCalls, name).offset
            self.assertEqual(off, lib.nf_stats_offset(f"calls.{name}".encode()), name)

    def test_conf_string(self):
        self.assertEqual(nofrag.conf_string(limit="40GiB", reserve=None, retain=0), "limit:40GiB,retain:0")


class TestHostPool(unittest.TestCase):
    """The public pool API through ctypes on a host backend."""

    def test_alloc_free_stats(self):
        lib = nofrag.load()
        be = ctypes.c_void_p()
        self.assertEqual(lib.nf_backend_host_create(ctypes.byref(be), 1 * GiB, 2 * MiB), 0, _lib.last_error())
        cfg = ctypes.create_string_buffer(1024)  # opaque nf_config_t, filled by the library
        self.assertEqual(lib.nf_config_default(cfg), 0)
        err = ctypes.create_string_buffer(256)
        self.assertEqual(lib.nf_config_parse(cfg, b"limit:32MiB", err, 256), 0, err.value)
        pool = ctypes.c_void_p()
        self.assertEqual(lib.nf_pool_create(ctypes.byref(pool), be, cfg), 0, _lib.last_error())
        try:
            ptrs = [lib.nf_alloc(pool, n, None) for n in (1000, 3 * MiB, 5 * MiB)]
            self.assertTrue(all(ptrs), _lib.last_error())
            ctypes.memset(ptrs[1], 0xAB, 3 * MiB)  # host backend memory is CPU-addressable
            self.assertEqual(ctypes.string_at(ptrs[1] + 3 * MiB - 4, 4), b"\xab" * 4)
            st = nofrag.NfStats()
            lib.nf_stats_get(pool, ctypes.byref(st))
            self.assertEqual(st.live, 1000 + 8 * MiB)
            self.assertEqual(st.live_blocks, 3)
            self.assertEqual(st.limit, 32 * MiB)
            self.assertIsNone(lib.nf_alloc(pool, 64 * MiB, None))  # over the limit
            self.assertIn("OOM", lib.nf_status_str(lib.nf_last_status()).decode())
            for p in ptrs:
                self.assertEqual(lib.nf_free(pool, p), 0)
            self.assertNotEqual(lib.nf_free(pool, ptrs[0]), 0)  # double free is refused
            self.assertEqual(lib.nf_pool_check(pool), 0, _lib.last_error())
            lib.nf_stats_get(pool, ctypes.byref(st))
            self.assertEqual(st.live, 0)
            self.assertEqual(st.invalid_frees, 1)
        finally:
            lib.nf_pool_destroy(pool)
            lib.nf_backend_destroy(be)

    def test_pool_from_string(self):
        lib = nofrag.load()
        pool = ctypes.c_void_p()
        rc = lib.nf_pool_create_from_string(ctypes.byref(pool), HOST_CONF.encode())
        self.assertEqual(rc, 0, _lib.last_error())
        p = lib.nf_alloc(pool, 4 * MiB, None)
        self.assertTrue(p)
        self.assertEqual(lib.nf_free(pool, p), 0)
        lib.nf_pool_destroy(pool)


class TestPluginOnHost(unittest.TestCase):
    """nf_torch_* entry points, as PyTorch would call them, on the host backend."""

    def setUp(self):
        self.lib = nofrag.load()
        # Where torch (libc10) is loaded, a failed allocation would raise a C++
        # exception, which cannot cross ctypes: return NULL in these tests.
        self.throw = self.lib.nf_torch_set_throw(0)
        self.lib.nf_torch_shutdown()
        nofrag.configure(HOST_CONF)

    def tearDown(self):
        self.lib.nf_torch_shutdown()
        self.lib.nf_torch_configure(None)
        self.lib.nf_torch_set_throw(self.throw)

    def test_alloc_free_and_stats(self):
        lib = self.lib
        self.assertFalse(nofrag.stats(0)["pool"])
        p = lib.nf_torch_alloc(3 * MiB, 0, None)
        q = lib.nf_torch_alloc(100, 0, 7)  # another "stream"
        self.assertTrue(p and q, _lib.last_error())
        s = nofrag.stats(0)
        self.assertTrue(s["pool"])
        self.assertEqual(s["live"], 3 * MiB + 100)
        self.assertEqual(s["live_rounded"], 3 * MiB + 512)
        self.assertGreaterEqual(s["mapped"], 4 * MiB)
        lib.nf_torch_record_stream(p, 9)
        lib.nf_torch_free(p, 3 * MiB, 0, None)
        lib.nf_torch_free(q, 100, 0, 7)
        c = nofrag.counters(0)
        self.assertEqual((c["bytes_allocated"], c["bytes_freed"], c["allocs"], c["frees"]),
                         (3 * MiB + 100, 3 * MiB + 100, 2, 2))
        self.assertEqual(nofrag.stats(0)["live"], 0)
        self.assertIsNone(lib.nf_torch_alloc(0, 0, None))  # empty storage: NULL, not an error

    def test_host_alloc_places_new_blocks_in_host_memory(self):
        # What offload_optimizer(mode="resident") relies on: while set, big
        # blocks of this thread land in host memory (same address, contents
        # writable), small ones and other calls stay on the device.
        lib = self.lib
        lib.nf_torch_set_host_alloc.restype = ctypes.c_size_t
        lib.nf_torch_set_host_alloc.argtypes = [ctypes.c_size_t]
        self.assertEqual(lib.nf_torch_set_host_alloc(4 * MiB), 0)
        try:
            big = lib.nf_torch_alloc(16 * MiB, 0, None)
            small = lib.nf_torch_alloc(1 * MiB, 0, None)
        finally:
            self.assertEqual(lib.nf_torch_set_host_alloc(0), 4 * MiB)
        after = lib.nf_torch_alloc(16 * MiB, 0, None)
        self.assertTrue(big and small and after, _lib.last_error())
        pool = lib.nf_torch_pool(0)
        self.assertEqual(nofrag.block_tiers(pool, big), {"device": 0, "host": 16 * MiB, "disk": 0})
        self.assertEqual(nofrag.block_tiers(pool, small)["host"], 0)
        self.assertEqual(nofrag.block_tiers(pool, after)["host"], 0)
        ctypes.memset(big, 0x5A, 16 * MiB)  # in place, like a kernel writing the optimizer state
        self.assertEqual(ctypes.string_at(big + 16 * MiB - 4, 4), b"\x5a" * 4)
        s = nofrag.stats(0)
        self.assertEqual(s["offloaded"], 16 * MiB)
        for p, n in ((big, 16 * MiB), (small, MiB), (after, 16 * MiB)):
            lib.nf_torch_free(p, n, 0, None)

    def test_trace_path_per_device(self):
        # One configuration string builds every device's pool, and each
        # recorder truncates its file: device 1 records beside device 0.
        with tempfile.TemporaryDirectory() as d:
            self.lib.nf_torch_shutdown()
            nofrag.configure(HOST_CONF + ",trace:" + os.path.join(d, "job.csv"))
            p0 = self.lib.nf_torch_alloc(MiB, 0, None)
            p1 = self.lib.nf_torch_alloc(2 * MiB, 1, None)
            self.assertTrue(p0 and p1, _lib.last_error())
            self.lib.nf_torch_free(p0, MiB, 0, None)
            self.lib.nf_torch_free(p1, 2 * MiB, 1, None)
            self.lib.nf_torch_shutdown()  # destroys the pools: files complete
            self.assertEqual(sorted(os.listdir(d)), ["job.csv", "job.dev1.csv"])
            for name, size in (("job.csv", MiB), ("job.dev1.csv", 2 * MiB)):
                with open(os.path.join(d, name)) as f:
                    rows = f.read().splitlines()[1:]
                self.assertEqual([r.split(",")[2] for r in rows], ["allocate", "free"], name)
                self.assertEqual({int(r.split(",")[4]) for r in rows}, {size}, name)

    def test_configure_refused_once_pool_exists(self):
        p = self.lib.nf_torch_alloc(MiB, 0, None)
        self.assertTrue(p)
        with self.assertRaises(ValueError):
            nofrag.configure("limit:1GiB")
        self.assertIn("already", nofrag.last_error())
        self.lib.nf_torch_free(p, MiB, 0, None)

    def test_bad_config(self):
        self.lib.nf_torch_shutdown()
        with self.assertRaises(ValueError):
            nofrag.configure("no_such_key:1")

    def test_oom_returns_null_without_torch(self):
        # Raising is off (setUp): the plug-in returns NULL and records why.
        self.assertIsNone(self.lib.nf_torch_alloc(256 * MiB, 0, None))
        self.assertIn("out of memory", nofrag.last_error())
        self.assertEqual(nofrag.counters(0)["failed_allocs"], 1)

    def test_snapshot_of_the_plugin_pool(self):
        p = self.lib.nf_torch_alloc(3 * MiB, 0, None)
        self.assertTrue(p, _lib.last_error())
        snap = nofrag.snapshot()  # the plug-in's pool for device 0
        self.assertEqual(snap["totals"]["live"], nofrag.stats(0)["live"])
        self.assertGreaterEqual(snap["totals"]["live"], 3 * MiB)
        self.lib.nf_torch_free(p, 3 * MiB, 0, None)

    def test_oom_message_carries_the_suggestion(self):
        # What PyTorch's exception text would say: the one-line cause plus the
        # OOM report's suggestion.
        a = self.lib.nf_torch_alloc(40 * MiB, 0, None)
        self.assertTrue(a, _lib.last_error())
        self.assertIsNone(self.lib.nf_torch_alloc(40 * MiB, 0, None))
        msg = nofrag.last_error()
        self.assertIn("CUDA out of memory (nofrag)", msg)
        self.assertIn("suggestion: live memory alone exceeds the limit", msg)
        self.lib.nf_torch_free(a, 40 * MiB, 0, None)

    def test_fraction_sets_limit(self):
        lib = self.lib
        lib.nf_torch_set_fraction(0.25, 0)  # host capacity 1 GiB -> 256 MiB
        self.assertEqual(nofrag.stats(0)["limit"], 256 * MiB)
        self.assertAlmostEqual(lib.nf_torch_get_fraction(0), 0.25)
        p = lib.nf_torch_alloc(200 * MiB, 0, None)
        self.assertTrue(p, _lib.last_error())
        lib.nf_torch_free(p, 200 * MiB, 0, None)

    def test_fraction_zero_refuses_every_request(self):
        # PyTorch's allocator with fraction 0 fails every request that needs
        # new memory; a limit of 0 would mean "the whole device" to nofrag,
        # so the plug-in refuses every request.
        lib = self.lib
        lib.nf_torch_set_fraction(0.25, 0)
        self.assertEqual(lib.nf_torch_last_status(), 0)
        lib.nf_torch_set_fraction(0.0, 0)
        self.assertEqual(lib.nf_torch_last_status(), 0)
        self.assertEqual(lib.nf_torch_get_fraction(0), 0.0)
        self.assertEqual(nofrag.stats(0)["limit"], 256 * MiB)  # kept meanwhile
        self.assertIsNone(lib.nf_torch_alloc(1 * MiB, 0, None))
        self.assertEqual(lib.nf_torch_last_status(), _lib.NF_ERR_OOM)
        self.assertIn("CUDA out of memory (nofrag)", nofrag.last_error())
        self.assertIn("memory fraction 0", nofrag.last_error())
        lib.nf_torch_set_fraction(1e-9, 0)  # below one granule: refused as well
        self.assertIsNone(lib.nf_torch_alloc(512, 0, None))
        lib.nf_torch_set_fraction(0.5, 0)
        p = lib.nf_torch_alloc(1 * MiB, 0, None)
        self.assertTrue(p, _lib.last_error())
        self.assertEqual(lib.nf_torch_last_status(), 0)
        self.assertEqual(nofrag.stats(0)["limit"], 512 * MiB)
        lib.nf_torch_free(p, 1 * MiB, 0, None)
        lib.nf_torch_set_fraction(1.5, 0)
        self.assertEqual(lib.nf_torch_last_status(), _lib.NF_ERR_INVALID)
        self.assertAlmostEqual(lib.nf_torch_get_fraction(0), 0.5)

    def test_fraction_refusals_count_as_ooms(self):
        # PyTorch counts a request refused by the memory fraction in
        # num_ooms; the plug-in refuses it before the pool sees it, so the
        # pool's own `ooms` stays put: num_ooms adds the plug-in's refusals
        # (and a reset of the accumulated stats starts them from 0 too).
        lib = self.lib
        before = nft.nested_stats(0)["num_ooms"]
        lib.nf_torch_set_fraction(0.0, 0)
        for _ in range(3):
            self.assertIsNone(lib.nf_torch_alloc(1 * MiB, 0, None))
        lib.nf_torch_set_fraction(0.5, 0)
        self.assertEqual(nft.nested_stats(0)["num_ooms"], before + 3)
        nft._mark_baseline(0)  # what reset_accumulated_memory_stats does on the ctypes path
        self.assertEqual(nft.nested_stats(0)["num_ooms"], 0)
        self.assertIsNone(lib.nf_torch_alloc(1 << 40, 0, None))  # a real OOM: the pool's own count
        self.assertEqual(nft.nested_stats(0)["num_ooms"], 1)
        nft._state["baseline"].pop(0, None)

    def test_failures_report_their_status(self):
        # The C++ adapter raises OutOfMemoryError only for NF_ERR_OOM, and
        # raises (not logs) a failed record_stream or free: it reads these.
        lib = self.lib
        p = lib.nf_torch_alloc(1 * MiB, 0, None)
        self.assertTrue(p, _lib.last_error())
        lib.nf_torch_record_stream(p, 9)
        self.assertEqual(lib.nf_torch_last_status(), 0)
        lib.nf_torch_record_stream(p + 512, 9)  # interior: not a live block
        self.assertEqual(lib.nf_torch_last_status(), _lib.NF_ERR_INVALID)
        self.assertEqual(lib.nf_torch_free_any(p), 0, nofrag.last_error())
        self.assertEqual(lib.nf_torch_last_status(), 0)
        self.assertEqual(lib.nf_torch_free_any(p), -1)  # double free
        self.assertEqual(lib.nf_torch_last_status(), _lib.NF_ERR_INVALID)
        # A pool keeps 64 streams. A 65th takes the slot of a stream that only
        # live blocks' allocations name; their frees find a slot again.
        ptrs = [lib.nf_torch_alloc(512, 0, s) for s in range(1, 65)]
        self.assertTrue(all(ptrs), _lib.last_error())
        t = lib.nf_torch_alloc(512, 0, 2000)
        self.assertTrue(t, _lib.last_error())
        self.assertTrue(nft.stream_known(1, 0))  # stream 1's slot went, its live block still names it
        self.assertEqual(lib.nf_torch_free_any(t), 0, nofrag.last_error())
        self.assertEqual(lib.nf_torch_free_any(ptrs[0]), 0, nofrag.last_error())
        ptrs[0] = lib.nf_torch_alloc(512, 0, 1)
        self.assertTrue(ptrs[0], _lib.last_error())
        # Where record_stream names every slot, the 65th is refused, and it is
        # not an out-of-memory error.
        for k, x in enumerate(ptrs):
            lib.nf_torch_record_stream(x, k + 2 if k < 63 else 1)  # every stream named
            self.assertEqual(lib.nf_torch_last_status(), 0, nofrag.last_error())
        self.assertIsNone(lib.nf_torch_alloc(512, 0, 1000))
        st = lib.nf_torch_last_status()
        self.assertNotIn(st, (0, _lib.NF_ERR_OOM))
        self.assertIn("not out of memory", nofrag.last_error())
        # What to do about it, whole (the plug-in's message kept 299 bytes of the cause before)
        self.assertIn("routes and captures keep theirs) (live", nofrag.last_error())
        self.assertTrue(nft.stream_known(5, 0))  # live blocks name streams 1..64
        self.assertFalse(nft.stream_known(1000, 0))
        lib.nf_torch_record_stream(ptrs[5], 1001)
        self.assertEqual(lib.nf_torch_last_status(), st)
        for x in ptrs:
            lib.nf_torch_free_any(x)
        # Nothing names them now: a 65th stream makes the pool forget them
        # (one device wait) instead of failing.
        r = lib.nf_torch_alloc(512, 0, 1002)
        self.assertTrue(r, _lib.last_error())
        self.assertTrue(nft.stream_known(1002, 0))
        self.assertFalse(nft.stream_known(5, 0))
        lib.nf_torch_free_any(r)

    def test_stream_known_uses_the_streams_device(self):
        # A torch.cuda.Stream / ExternalStream carries its device: without a
        # device argument it must be looked up in that device's pool, not in
        # device 0's (whose False let a caller destroy a stream cuda:1's pool
        # may still record events on).
        lib = self.lib
        p0 = lib.nf_torch_alloc(MiB, 0, None)
        p1 = lib.nf_torch_alloc(MiB, 1, 0x77)
        self.assertTrue(p0 and p1, _lib.last_error())
        s = types.SimpleNamespace(cuda_stream=0x77, device_index=1)
        self.assertTrue(nft.stream_known(s))
        self.assertTrue(nft.stream_known(s, 1))
        self.assertFalse(nft.stream_known(s, 0))
        self.assertFalse(nft.stream_known(0x77))  # a raw handle: device 0, as before
        lib.nf_torch_free(p0, MiB, 0, None)
        lib.nf_torch_free(p1, MiB, 1, 0x77)

    def test_reset_trims_and_peaks(self):
        lib = self.lib
        ps = [lib.nf_torch_alloc(4 * MiB, 0, None) for _ in range(4)]
        for p in ps:
            lib.nf_torch_free(p, 4 * MiB, 0, None)
        self.assertGreaterEqual(nofrag.stats(0)["live_peak"], 16 * MiB)
        lib.nf_torch_reset()  # empty_cache
        s = nofrag.stats(0)
        self.assertEqual(s["mapped"], 0)
        lib.nf_torch_reset_peaks(0)
        self.assertEqual(nofrag.stats(0)["live_peak"], 0)

    def test_torch_key_mapping(self):
        lib = self.lib
        p = lib.nf_torch_alloc(5 * MiB + 3, 0, None)
        f = nft.flat_stats(0)
        s = nofrag.stats(0)
        self.assertEqual(f["allocated_bytes.all.current"], s["live_rounded"])
        self.assertEqual(f["requested_bytes.all.current"], 5 * MiB + 3)
        self.assertEqual(f["reserved_bytes.all.current"], s["physical"])
        self.assertEqual(f["reserved_bytes.all.peak"], s["physical_peak"])
        self.assertEqual(f["allocation.all.current"], 1)
        self.assertEqual(f["nofrag.mapped"], s["mapped"])
        self.assertEqual(f["allocated_bytes.small_pool.current"], 0)
        self.assertIn("num_alloc_retries", f)
        self.assertIn("nofrag memory summary", nft.summary(0))
        # The time in backend calls: flattened per kind, and in the summary.
        self.assertEqual(f["nofrag.backend_ns"], sum(f[f"nofrag.call_ns.{k}"] for k in s["call_ns"]))
        self.assertGreater(f["nofrag.call_ns.map"], 0)
        self.assertIn(" time in them ", nft.summary(0))
        lib.nf_torch_free(p, 5 * MiB + 3, 0, None)
        nft._mark_baseline(0)
        self.assertEqual(nft.flat_stats(0)["allocation.all.allocated"], 0)

    def test_reserved_allocated_minus_freed_is_current(self):
        # PyTorch's invariant current == allocated - freed, with units (one
        # create call for many granules) and spill (host granules, which are
        # not device memory) in play.
        lib = self.lib
        lib.nf_torch_shutdown()
        nofrag.configure(HOST_CONF + ",units:4,spill:host,spill_limit:64MiB")
        ps = [lib.nf_torch_alloc(24 * MiB, 0, None) for _ in range(3)]  # 72 MiB: past the limit, spilled
        self.assertTrue(all(ps), _lib.last_error())
        s = nofrag.stats(0)
        self.assertGreater(s["units_made"], 0)
        self.assertGreater(s["spilled"], 0)
        for p in ps[:2]:
            lib.nf_torch_free(p, 24 * MiB, 0, None)
        lib.nf_torch_reset()  # empty_cache: granules and units go back
        for size in (3 * MiB, 10 * MiB):
            lib.nf_torch_free(lib.nf_torch_alloc(size, 0, None), size, 0, None)
        s = nofrag.stats(0)
        f = nft.flat_stats(0)
        self.assertGreater(f["reserved_bytes.all.freed"], 0)
        self.assertEqual(f["reserved_bytes.all.current"], s["physical"])
        self.assertEqual(f["reserved_bytes.all.allocated"] - f["reserved_bytes.all.freed"], s["physical"])
        self.assertEqual(f["segment.all.allocated"] - f["segment.all.freed"], s["physical"] // (2 * MiB))
        lib.nf_torch_free(ps[2], 24 * MiB, 0, None)


@unittest.skipIf(HAVE_TORCH, "torch is installed")
class TestWithoutTorch(unittest.TestCase):
    def test_enable_says_what_is_missing(self):
        # Not a bare "No module named 'torch'" from inside the package.
        import nofrag.torch as nft
        with self.assertRaisesRegex(ImportError, "nofrag.torch needs PyTorch"):
            nft.enable()


@unittest.skipUnless(HAVE_TORCH, "torch not installed")
class TestTorch(unittest.TestCase):
    def test_enable_refuses_after_cuda_init(self):
        import torch
        if not torch.cuda.is_available():
            self.skipTest("no CUDA")
        torch.cuda.init()
        with self.assertRaises(RuntimeError) as cm:
            nft.enable()
        self.assertIn("before CUDA is initialised", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
