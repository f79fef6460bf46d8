"""nofrag.snapshot() on a host pool through ctypes (no torch, no GPU), and its
export in PyTorch's memory-snapshot format (nofrag.export_torch_snapshot),
read back with the converter's own loader (the one that reads
../shared/traces/gpt2_small_snapshot.pickle.gz).

    NOFRAG_LIB=build/libnofrag.so python3 -m unittest discover -s python/tests -v
"""

import ctypes
import gzip
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

import nofrag  # noqa: E402
from nofrag import _lib, torch_trace  # noqa: E402

try:
    from torch.cuda import _memory_viz  # noqa: F401
    HAVE_TORCH = True
except Exception:  # ImportError, or a torch build without CUDA bits
    HAVE_TORCH = False

MiB = 1 << 20


class TestRecordedTrace(unittest.TestCase):
    """trace:PATH recording -> device_traces of the PyTorch-format export."""

    def test_recorded_trace_becomes_device_traces(self):
        lib = nofrag.load()
        d = tempfile.mkdtemp()
        try:
            log = os.path.join(d, "rec.csv")
            pool = ctypes.c_void_p()
            conf = f"backend:host,host_capacity:1GiB,limit:64MiB,granule:2MiB,trace:{log}".encode()
            self.assertEqual(lib.nf_pool_create_from_string(ctypes.byref(pool), conf), 0, _lib.last_error())
            ptrs = [lib.nf_alloc(pool, n, None) for n in (4096, 3 * MiB, 5 * MiB)]
            self.assertTrue(all(ptrs), _lib.last_error())
            self.assertEqual(lib.nf_free(pool, ptrs[1]), 0)
            snap = nofrag.snapshot(pool)
            lib.nf_pool_destroy(pool)  # flushes the recording
            entries = torch_trace.trace_from_rmm(log)
            self.assertEqual([e["action"] for e in entries],
                             ["alloc"] * 3 + ["free_requested", "free_completed"])
            self.assertEqual([e["addr"] for e in entries[:3]], ptrs)
            self.assertEqual(entries[3]["size"], 3 * MiB)
            out = os.path.join(d, "snap.pickle.gz")
            torch_trace.export_torch_snapshot(snap, out, trace=entries)
            back = torch_trace.load(out)
            self.assertEqual(len(back["device_traces"][0]), 5)
            lines = list(torch_trace.iter_lines(back, path=out))
            self.assertEqual(sum(1 for ln in lines if ln.startswith("alloc ")), 3)
        finally:
            shutil.rmtree(d)

    def test_bad_log(self):
        d = tempfile.mkdtemp()
        try:
            p = os.path.join(d, "bad.csv")
            with open(p, "w") as f:
                f.write("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:01:5,allocate,0x10,zz,0x0\n")
            with self.assertRaisesRegex(ValueError, "bad.csv:2"):
                torch_trace.trace_from_rmm(p)
        finally:
            shutil.rmtree(d)

    def test_no_pool(self):
        lib = nofrag.load()
        lib.nf_torch_shutdown()
        with self.assertRaisesRegex(ValueError, "no pool"):
            nofrag.snapshot()


class TestPluginDevice(unittest.TestCase):
    """The plug-in's pool of device 1, exported with the default arguments:
    its segments are device 1's (they were labelled device 0)."""

    def test_export_keeps_the_pools_device(self):
        lib = nofrag.load()
        throw = lib.nf_torch_set_throw(0)
        lib.nf_torch_shutdown()
        nofrag.configure("backend:host,host_capacity:1GiB,limit:64MiB,granule:2MiB")
        try:
            p = lib.nf_torch_alloc(3 * MiB, 1, None)
            self.assertTrue(p, _lib.last_error())
            snap = nofrag.snapshot(device=1)
            self.assertEqual(snap["device"], 1)
            d = nofrag.snapshot_to_torch(snap)
            self.assertTrue(d["segments"])
            self.assertEqual({s["device"] for s in d["segments"]}, {1})
            self.assertEqual(len(d["device_traces"]), 2)
            self.assertEqual({s["device"] for s in nofrag.snapshot_to_torch(snap, device=0)["segments"]}, {0})
            lib.nf_torch_free(p, 3 * MiB, 1, None)
        finally:
            lib.nf_torch_shutdown()
            lib.nf_torch_configure(None)
            lib.nf_torch_set_throw(throw)


class TestSnapshot(unittest.TestCase):
    def setUp(self):
        self.lib = nofrag.load()
        self.pool = ctypes.c_void_p()
        conf = b"backend:host,host_capacity:1GiB,limit:64MiB,granule:2MiB"
        self.assertEqual(self.lib.nf_pool_create_from_string(ctypes.byref(self.pool), conf), 0,
                         _lib.last_error())

    def tearDown(self):
        self.lib.nf_pool_destroy(self.pool)

    def test_snapshot_matches_stats(self):
        lib = self.lib
        ptrs = [lib.nf_alloc(self.pool, n, s) for n, s in ((1000, None), (3 * MiB, 7), (5 * MiB, None))]
        self.assertTrue(all(ptrs), _lib.last_error())
        self.assertEqual(lib.nf_free(self.pool, ptrs[1]), 0)
        snap = nofrag.snapshot(self.pool)
        st = nofrag.NfStats()
        lib.nf_stats_get(self.pool, ctypes.byref(st))
        t = snap["totals"]
        for k in ("live", "live_rounded", "mapped", "physical", "limit", "granule", "cached", "live_blocks"):
            self.assertEqual(t[k], getattr(st, k), k)
        blocks = [b for c in snap["chunks"] for b in c["blocks"]]
        live = {int(b["addr"], 16): b["requested"] for b in blocks if b["state"] == "live"}
        self.assertEqual(live, {ptrs[0]: 1000, ptrs[2]: 5 * MiB})
        runs = [r for c in snap["chunks"] for r in c["mapped"]]
        self.assertEqual(sum(r["count"] for r in runs) * st.granule, st.mapped)
        self.assertEqual(snap["granules"]["mapped"] * st.granule, st.mapped)
        for p in (ptrs[0], ptrs[2]):
            self.assertEqual(lib.nf_free(self.pool, p), 0)
        self.assertEqual(nofrag.pool_snapshot(self.pool.value)["totals"]["live_blocks"], 0)

    def test_no_pool(self):
        for f in (nofrag.snapshot, nofrag.pool_snapshot):
            with self.assertRaises(ValueError):
                f(None)
        with self.assertRaises(ValueError):
            nofrag.snapshot()
        self.assertIs(nofrag.pool_snapshot, nofrag.snapshot)


class TestTorchExport(unittest.TestCase):
    def setUp(self):
        self.lib = nofrag.load()
        self.pool = ctypes.c_void_p()
        conf = b"backend:host,host_capacity:1GiB,limit:64MiB,granule:2MiB"
        self.assertEqual(self.lib.nf_pool_create_from_string(ctypes.byref(self.pool), conf), 0,
                         _lib.last_error())
        self.dir = tempfile.mkdtemp(prefix="nofrag-export-")
        self.ptrs = []

    def tearDown(self):
        for q in self.ptrs:
            self.lib.nf_free(self.pool, q)
        self.lib.nf_pool_destroy(self.pool)
        shutil.rmtree(self.dir, ignore_errors=True)

    def alloc(self, n, stream=None):
        q = self.lib.nf_alloc(self.pool, n, stream)
        self.assertTrue(q, _lib.last_error())
        self.ptrs.append(q)
        return q

    def free(self, q):
        self.assertEqual(self.lib.nf_free(self.pool, q), 0)
        self.ptrs.remove(q)

    def stats(self):
        st = nofrag.NfStats()
        self.lib.nf_stats_get(self.pool, ctypes.byref(st))
        return st

    def check(self, d, st, live):
        """d (PyTorch format) against the pool's stats and its live blocks {addr: requested}."""
        self.assertEqual(set(d), {"segments", "device_traces", "allocator_settings"})
        segs = d["segments"]
        self.assertEqual(sum(s["total_size"] for s in segs), st.mapped)
        self.assertEqual(sum(s["allocated_size"] for s in segs), st.live_rounded)
        self.assertEqual(sum(s["requested_size"] for s in segs), st.live)
        got = {}
        for s in segs:
            self.assertEqual(set(s), {"device", "address", "total_size", "allocated_size", "active_size",
                                      "requested_size", "stream", "segment_type", "segment_pool_id",
                                      "is_expandable", "frames", "blocks"})
            self.assertIn(s["segment_type"], ("large", "small"))
            self.assertEqual(s["segment_pool_id"], (0, 0))
            # Blocks tile the segment in address order (segment_plot and
            # segsum rebuild addresses by adding sizes, and assert the sum).
            a = s["address"]
            for b in s["blocks"]:
                self.assertEqual(set(b), {"address", "size", "requested_size", "state", "frames"})
                self.assertEqual(b["address"], a)
                self.assertGreater(b["size"], 0)
                self.assertLessEqual(b["requested_size"], b["size"])
                self.assertIn(b["state"], ("active_allocated", "active_pending_free", "inactive"))
                if b["state"] == "active_allocated":
                    got[b["address"]] = b["requested_size"]
                a += b["size"]
            self.assertEqual(a, s["address"] + s["total_size"])
            self.assertEqual(s["allocated_size"],
                             sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated"))
        # Segments do not overlap.
        spans = sorted((s["address"], s["address"] + s["total_size"]) for s in segs)
        for (_, e), (a, _) in zip(spans, spans[1:]):
            self.assertLess(e, a + 1)
        self.assertEqual(got, live)

    def test_export_round_trip(self):
        big = self.alloc(5 * MiB)
        mid = self.alloc(6 * MiB, 7)
        small = self.alloc(1000)
        tail = self.alloc(3 * MiB, 7)
        self.free(mid)
        self.assertEqual(self.lib.nf_trim(self.pool), 0)  # unmaps mid's whole granules: two mapped runs
        snap = nofrag.snapshot(self.pool)
        st = self.stats()
        live = {big: 5 * MiB, small: 1000, tail: 3 * MiB}
        d = nofrag.snapshot_to_torch(snap)
        self.check(d, st, live)
        self.assertEqual(d["device_traces"], [[]])
        self.assertGreaterEqual(len([s for s in d["segments"] if s["segment_type"] == "large"]), 2)  # split by trim
        self.assertTrue(d["allocator_settings"]["expandable_segments"])
        self.assertEqual(d["allocator_settings"]["nofrag"]["mapped"], st.mapped)
        streams = {s["stream"] for s in d["segments"]}
        self.assertTrue(streams <= {0, 7}, streams)

        for name in ("snap.pickle.gz", "snap.pickle"):
            path = os.path.join(self.dir, name)
            ret = nofrag.export_torch_snapshot(snap, path)
            self.assertEqual(ret, d)
            with open(path, "rb") as f:
                self.assertEqual(f.read(2) == b"\x1f\x8b", name.endswith(".gz"))
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                self.assertEqual(f.read(2), b"\x80\x04")  # pickle protocol 4: the CLI's pickle detection
            back = torch_trace.load(path)  # the safe loader used for the shared gpt2 snapshot
            self.assertEqual(back, d)
            self.check(back, st, live)
            out = os.path.join(self.dir, name + ".trace")
            self.assertEqual(torch_trace.convert(path, out)["lines"], 0)
            self.assertFalse(os.path.exists(path + ".tmp"))
            if HAVE_TORCH:
                from torch.cuda import _memory_viz
                self.assertIn("<html>", _memory_viz.segment_plot(back))
                self.assertIn("<html>", _memory_viz.trace_plot(back))

    def test_export_with_trace(self):
        a = self.alloc(3 * MiB)
        b = self.alloc(4096)
        snap = nofrag.snapshot(self.pool)
        trace = [{"action": "alloc", "addr": a, "size": 3 * MiB, "stream": 0, "time_us": 1},
                 {"action": "alloc", "addr": hex(b), "size": 4096, "stream": 0, "time_us": 2},
                 {"action": "free_requested", "addr": b, "size": 4096, "stream": 0, "time_us": 3},
                 {"action": "free_completed", "addr": b, "size": 4096, "stream": 0, "time_us": 3}]
        path = os.path.join(self.dir, "t.pickle.gz")
        d = nofrag.export_torch_snapshot(snap, path, device=1, trace=trace)
        self.assertEqual(len(d["device_traces"]), 2)
        self.assertEqual(d["device_traces"][0], [])
        self.assertEqual([e["addr"] for e in d["device_traces"][1]], [a, b, b, b])
        self.assertTrue(all(s["device"] == 1 for s in d["segments"]))
        out = os.path.join(self.dir, "t.trace")
        st = torch_trace.convert(path, out, device=1)
        self.assertEqual(st["lines"], 4)
        with open(out) as f:
            lines = [ln.strip() for ln in f if not ln.startswith("#")]
        self.assertEqual(lines, [f"alloc {a} {3 * MiB} 0 1", f"alloc {b} 4096 0 2",
                                 f"free_requested {b} 4096 0 3", f"free_completed {b} 4096 0 3"])

    def test_empty_pool_and_bad_input(self):
        d = nofrag.snapshot_to_torch(nofrag.snapshot(self.pool))
        st = self.stats()
        self.check(d, st, {})
        for bad in (None, {}, {"chunks": []}, [1, 2]):
            with self.assertRaises(ValueError):
                nofrag.snapshot_to_torch(bad)
        with self.assertRaises(ValueError):
            nofrag.snapshot_to_torch(nofrag.snapshot(self.pool), device=-1)

    def test_real_snapshot_shape(self):
        """Our export has the keys of a real _dump_snapshot (the shared gpt2 one)."""
        real = os.path.join(os.environ.get("NF_SHARED", os.path.join(HERE, "..", "..", "..", "shared")),
                            "traces", "gpt2_small_snapshot.pickle.gz")
        if not os.path.exists(real):
            self.skipTest("shared snapshot not found")
        r = torch_trace.load(real)
        self.alloc(MiB)
        d = nofrag.snapshot_to_torch(nofrag.snapshot(self.pool))
        self.assertTrue(set(d) <= set(r))
        self.assertEqual(set(d["segments"][0]), set(r["segments"][0]))
        self.assertEqual(set(d["segments"][0]["blocks"][0]), set(r["segments"][0]["blocks"][0]))
        for k in ("max_split_size", "garbage_collection_threshold", "expandable_segments"):
            self.assertIn(k, d["allocator_settings"])


if __name__ == "__main__":
    unittest.main()
