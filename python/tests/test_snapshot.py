"""nofrag.pool_snapshot() on a host pool through ctypes (no torch, no GPU).

    NOFRAG_LIB=build/libnofrag.so python3 -m unittest discover -s python/tests -v
"""

import ctypes
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

import nofrag  # noqa: E402
from nofrag import _lib  # noqa: E402

MiB = 1 << 20


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
        snap = nofrag.pool_snapshot(self.pool)
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
        with self.assertRaises(ValueError):
            nofrag.pool_snapshot(None)


if __name__ == "__main__":
    unittest.main()
