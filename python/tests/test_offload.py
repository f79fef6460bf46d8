"""Spill and same-address offload from Python (issue 7), on the host backend:
no torch, no GPU.

    NOFRAG_LIB=build/libnofrag.so python3 -m unittest discover -s python/tests -v

- TestPoolOffload / TestSpill: nofrag.offload / prefetch / offload_wait /
  block_tiers and the spill config on pools made by
  nf_pool_create_from_string("backend:host,..."); the host backend's memory is
  CPU-addressable, so byte patterns are written with ctypes.memmove and read
  back after offload/prefetch cycles (never while offloaded: the rule).

The PyTorch helpers (nofrag.torch.offload, offload_optimizer,
offload_activations) are tested in test_offload_torch.py.

Tests needing nf_offload skip (with the reason) when the library lacks it.
"""

import ctypes
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

import nofrag  # noqa: E402
from nofrag import _lib  # noqa: E402

MiB = 1 << 20
G = 2 * MiB
LIB = nofrag.load()
HAVE_OFFLOAD = all(hasattr(LIB, n) for n in ("nf_offload", "nf_prefetch", "nf_offload_wait", "nf_block_tiers"))
NO_OFFLOAD = f"{_lib.path()} has no nf_offload (C side of issue 7 not built)"
SPILL_CONF = "backend:host,host_capacity:256MiB,granule:2MiB,limit:32MiB,spill:host"
PLAIN_CONF = "backend:host,host_capacity:256MiB,granule:2MiB,limit:32MiB"


def _config_parses(conf):
    cfg = ctypes.create_string_buffer(8192)
    LIB.nf_config_default(cfg)
    return LIB.nf_config_parse(cfg, conf.encode(), None, 0) == 0


HAVE_SPILL = _config_parses("spill:host,spill_limit:8MiB")


def pattern(seed, n):
    block = bytes((seed * 31 + i * 7) & 0xFF for i in range(251))  # 251: prime, no granule alignment
    return (block * (n // len(block) + 1))[:n]


def whole_granules(ptr, size, g=G):
    """Bytes of the granules lying wholly inside [ptr, ptr+size): what moves."""
    first = (ptr + g - 1) // g * g
    last = (ptr + size) // g * g
    return max(0, last - first)


class PoolCase(unittest.TestCase):
    conf = PLAIN_CONF

    def setUp(self):
        self.pool = ctypes.c_void_p()
        self.assertEqual(LIB.nf_pool_create_from_string(ctypes.byref(self.pool), self.conf.encode()), 0,
                         _lib.last_error())
        self.live = []

    def tearDown(self):
        for p in self.live:
            LIB.nf_free(self.pool, p)
        self.assertEqual(LIB.nf_pool_check(self.pool), 0, _lib.last_error())
        LIB.nf_pool_destroy(self.pool)

    def alloc(self, n, fill=None):
        p = LIB.nf_alloc(self.pool, n, None)
        self.assertTrue(p, f"nf_alloc({n}): {_lib.last_error()}")
        self.live.append(p)
        if fill is not None:
            ctypes.memmove(p, pattern(fill, n), n)
        return p

    def free(self, p):
        self.assertEqual(LIB.nf_free(self.pool, p), 0, _lib.last_error())
        self.live.remove(p)

    def assert_pattern(self, p, seed, n):
        self.assertEqual(ctypes.string_at(p, n), pattern(seed, n), f"data of block {p:#x} changed")

    def stats(self):
        return nofrag.pool_stats(self.pool)


class TestMirror(unittest.TestCase):
    def test_new_fields_mirrored(self):
        names = [n for n, _ in nofrag.NfStats._fields_]
        self.assertEqual(names[-2:], ["call_ns", "backend_ns"])
        names = names[:-2]
        self.assertEqual(names[-21:-12], ["spilled", "spilled_peak", "offloaded", "offloaded_disk", "host_physical",
                                           "host_physical_peak", "spills", "offloads", "prefetches"])
        self.assertEqual(names[-12:-8], ["views", "view_reuses", "view_moves", "view_evictions"])
        self.assertEqual(names[-8:-4], ["units", "units_made", "units_unmapped", "unit_splits"])
        self.assertEqual(names[-4:-2], ["physical_created", "physical_released"])
        self.assertEqual(names[-2:], ["edges", "edges_made"])
        self.assertEqual(ctypes.sizeof(nofrag.NfStats), LIB.nf_stats_size())
        for n in names[-21:]:
            self.assertEqual(getattr(nofrag.NfStats, n).offset, LIB.nf_stats_offset(n.encode()), n)
        off = nofrag.NfStats.calls.offset + nofrag.NfCalls.copy.offset
        self.assertEqual(off, LIB.nf_stats_offset(b"calls.copy"))
        for n in ("call_ns", "backend_ns"):
            self.assertEqual(getattr(nofrag.NfStats, n).offset, LIB.nf_stats_offset(n.encode()), n)
        off = nofrag.NfStats.call_ns.offset + nofrag.NfCalls.event_sync.offset
        self.assertEqual(off, LIB.nf_stats_offset(b"call_ns.event_sync"))

    def test_conf_string_keys(self):
        self.assertEqual(nofrag.conf_string(spill=True, spill_limit="8GiB", offload_dir="/scratch/x"),
                         "spill:host,spill_limit:8GiB,offload_dir:/scratch/x")
        self.assertEqual(nofrag.conf_string(spill=False), "spill:off")
        with self.assertRaises(ValueError):
            nofrag.conf_string(offload_dir="/a,b")

    def test_tier_and_argument_checks(self):
        with self.assertRaises(ValueError):
            nofrag.offload(1, 4096, tier="gpu")
        with self.assertRaises(ValueError):
            nofrag.offload(1, 4096, tier="device")
        with self.assertRaises(ValueError):
            nofrag.prefetch(None, 4096)  # no pool: refused before the library sees it
        with self.assertRaises(ValueError):
            nofrag.block_tiers(ctypes.c_void_p(), 4096)
        with self.assertRaises(TypeError):
            nofrag.offload("pool", 4096)


@unittest.skipUnless(HAVE_SPILL, "this build's config parser rejects spill:host / spill_limit")
class TestConfig(PoolCase):
    conf = SPILL_CONF + ",spill_limit:64MiB"

    def test_spill_keys_in_force(self):
        s = nofrag.pool_config(self.pool)
        self.assertIn("spill:host", s)
        self.assertTrue("spill_limit:67108864" in s or "spill_limit:64MiB" in s, s)

    def test_bad_values_rejected(self):
        for bad in ("spill:maybe", "spill_limit:lots"):
            self.assertFalse(_config_parses(bad), bad)


@unittest.skipUnless(HAVE_OFFLOAD, NO_OFFLOAD)
class TestPoolOffload(PoolCase):
    def test_cycles_keep_data_and_count(self):
        sizes = (8 * MiB, 6 * MiB + 512, 1024)  # a large block, an unaligned one, one under a granule
        ptrs = [self.alloc(n, fill=i) for i, n in enumerate(sizes)]
        st0 = self.stats()
        moved = [whole_granules(p, n) for p, n in zip(ptrs, sizes)]
        self.assertGreaterEqual(moved[0], 6 * MiB)
        self.assertEqual(moved[2], 0)
        for cycle in range(3):
            for p in ptrs:
                nofrag.offload(self.pool, p, stream=None, tier="host")
            nofrag.offload_wait(self.pool)
            for p, n, m in zip(ptrs, sizes, moved):
                t = nofrag.block_tiers(self.pool, p)
                self.assertEqual(t["host"], m, (cycle, hex(p), n, t))
                self.assertEqual(t["disk"], 0)
                self.assertEqual(t["device"] + t["host"], n, t)
            st = self.stats()
            self.assertEqual(st["offloaded"], sum(moved))
            self.assertEqual(st["offloads"] - st0["offloads"], 2 * (cycle + 1))  # the small block does not move
            self.assertEqual(st["live"], st0["live"])  # offloaded blocks stay live
            for p in ptrs:
                nofrag.prefetch(self.pool, p, stream=None)
            nofrag.offload_wait(self.pool)
            for i, (p, n) in enumerate(zip(ptrs, sizes)):
                self.assertEqual(nofrag.block_tiers(self.pool, p), {"device": n, "host": 0, "disk": 0})
                self.assert_pattern(p, i + 10 * cycle, n)
                ctypes.memmove(p, pattern(i + 10 * (cycle + 1), n), n)  # new contents for the next cycle
            st = self.stats()
            self.assertEqual(st["offloaded"], 0)
            self.assertEqual(st["prefetches"] - st0["prefetches"], 2 * (cycle + 1))
            self.assertEqual(LIB.nf_pool_check(self.pool), 0, _lib.last_error())
        self.assertGreater(self.stats()["calls"]["copy"], 0)

    def test_offload_twice_is_noop_and_prefetch_of_resident_is_noop(self):
        p = self.alloc(8 * MiB, fill=3)
        nofrag.prefetch(self.pool, p)  # not offloaded: no-op
        n0 = self.stats()["prefetches"]
        nofrag.offload(self.pool, p, stream=7)  # any stream value on the host backend
        nofrag.offload(self.pool, p, stream=7)
        nofrag.offload_wait(self.pool)
        self.assertEqual(self.stats()["offloads"], 1)
        nofrag.prefetch(self.pool, p, stream=7)
        nofrag.offload_wait(self.pool)
        self.assertEqual(self.stats()["prefetches"], n0 + 1)
        self.assert_pattern(p, 3, 8 * MiB)

    def test_offload_frees_device_memory_and_prefetch_can_oom(self):
        # limit 32 MiB: A (24 MiB) and B (24 MiB) do not fit together on the device.
        a = self.alloc(24 * MiB, fill=1)
        nofrag.offload(self.pool, a)
        nofrag.offload_wait(self.pool)
        b = self.alloc(24 * MiB, fill=2)  # fits only because A's granules went to the host
        st = self.stats()
        self.assertLessEqual(st["physical"], 32 * MiB)
        self.assertEqual(st["spilled"], 0)
        with self.assertRaises(nofrag.NofragError) as cm:
            nofrag.prefetch(self.pool, a)
        self.assertTrue(cm.exception.is_oom, str(cm.exception))
        self.assertGreater(nofrag.block_tiers(self.pool, a)["host"], 0)  # still offloaded
        self.free(b)
        nofrag.prefetch(self.pool, a)
        nofrag.offload_wait(self.pool)
        self.assertEqual(nofrag.block_tiers(self.pool, a)["host"], 0)
        self.assert_pattern(a, 1, 24 * MiB)

    def test_disk_tier(self):
        d = tempfile.mkdtemp(prefix="nofrag-offload-")
        try:
            pool = ctypes.c_void_p()
            conf = f"{PLAIN_CONF},offload_dir:{d}".encode()
            self.assertEqual(LIB.nf_pool_create_from_string(ctypes.byref(pool), conf), 0, _lib.last_error())
            try:
                p = LIB.nf_alloc(pool, 10 * MiB, None)
                self.assertTrue(p)
                ctypes.memmove(p, pattern(5, 10 * MiB), 10 * MiB)
                nofrag.offload(pool, p, tier="disk")  # synchronous
                t = nofrag.block_tiers(pool, p)
                self.assertEqual(t["disk"], whole_granules(p, 10 * MiB), t)
                self.assertEqual(t["host"], 0)
                self.assertEqual(nofrag.pool_stats(pool)["offloaded_disk"], t["disk"])
                self.assertEqual(os.listdir(d), [])  # the file is unlinked at creation
                nofrag.offload(pool, p, tier="disk")  # same tier: no-op
                with self.assertRaises(nofrag.NofragError) as cm:
                    nofrag.offload(pool, p, tier="host")  # another tier: refused
                self.assertEqual(cm.exception.status, _lib.NF_ERR_INVALID)
                nofrag.prefetch(pool, p)
                nofrag.offload_wait(pool)
                self.assertEqual(ctypes.string_at(p, 10 * MiB), pattern(5, 10 * MiB))
                self.assertEqual(nofrag.pool_stats(pool)["offloaded_disk"], 0)
                nofrag.offload(pool, p, tier="disk")
                self.assertEqual(LIB.nf_free(pool, p), 0)  # freeing an offloaded block is allowed
                st = nofrag.pool_stats(pool)
                self.assertEqual((st["live"], st["offloaded_disk"]), (0, 0))
                self.assertEqual(LIB.nf_pool_check(pool), 0, _lib.last_error())
            finally:
                LIB.nf_pool_destroy(pool)
        finally:
            shutil.rmtree(d)

    def test_free_while_offloaded(self):
        p = self.alloc(12 * MiB, fill=4)
        q = self.alloc(4 * MiB, fill=6)
        nofrag.offload(self.pool, p)
        self.free(p)  # copy possibly still pending: allowed, releases everything
        nofrag.offload_wait(self.pool)
        st = self.stats()
        self.assertEqual(st["offloaded"], 0)
        self.assertEqual(st["live"], 4 * MiB)
        self.assert_pattern(q, 6, 4 * MiB)

    def test_errors_raise_with_the_library_message(self):
        p = self.alloc(8 * MiB)
        gone = self.alloc(4 * MiB)
        self.free(gone)
        for bad in (0x1234000, p + 512, gone):
            for call in (lambda x: nofrag.offload(self.pool, x), lambda x: nofrag.prefetch(self.pool, x),
                         lambda x: nofrag.block_tiers(self.pool, x)):
                with self.assertRaises(nofrag.NofragError) as cm:
                    call(bad)
                e = cm.exception
                self.assertEqual(e.status, _lib.NF_ERR_INVALID, str(e))
                self.assertEqual(e.status_name, "NF_ERR_INVALID")
                self.assertIn(f"{bad:#x}", str(e))
                self.assertTrue(e.detail, f"no nf_last_error() message for {e.what}")
        self.assertEqual(nofrag.block_tiers(self.pool, p)["device"], 8 * MiB)  # nothing changed


@unittest.skipUnless(HAVE_SPILL, "this build's config parser rejects spill:host")
class TestSpill(PoolCase):
    conf = SPILL_CONF

    def test_one_and_a_half_times_the_limit_succeeds(self):
        blocks = [self.alloc(4 * MiB, fill=i) for i in range(12)]  # 48 MiB under a 32 MiB limit
        st = self.stats()
        self.assertGreater(st["spilled"], 0)
        self.assertGreaterEqual(st["spilled"], 48 * MiB - 32 * MiB)
        self.assertGreaterEqual(st["spilled_peak"], st["spilled"])
        self.assertGreaterEqual(st["spills"], 1)
        self.assertLessEqual(st["physical"], 32 * MiB)  # device granules stay under the limit
        self.assertGreaterEqual(st["mapped"], 48 * MiB)
        self.assertEqual(st["ooms"], 0)
        if HAVE_OFFLOAD:  # spilled granules show as host in block_tiers
            host = sum(nofrag.block_tiers(self.pool, b)["host"] for b in blocks)
            self.assertGreater(host, 0)
        for i, b in enumerate(blocks):  # spilled memory is ordinary (slower) memory
            self.assert_pattern(b, i, 4 * MiB)
        for b in list(blocks):
            self.free(b)
        self.assertEqual(LIB.nf_trim(self.pool), 0)
        st = self.stats()
        self.assertEqual((st["spilled"], st["live"], st["mapped"]), (0, 0, 0))

    def test_single_block_over_the_limit(self):
        p = self.alloc(48 * MiB, fill=9)
        st = self.stats()
        self.assertGreaterEqual(st["spilled"], 16 * MiB)
        if HAVE_OFFLOAD:
            t = nofrag.block_tiers(self.pool, p)
            self.assertEqual(t["device"] + t["host"], 48 * MiB, t)
            self.assertGreaterEqual(t["host"], 16 * MiB)
        self.assert_pattern(p, 9, 48 * MiB)

    def test_without_spill_the_same_fails_with_oom(self):
        pool = ctypes.c_void_p()
        self.assertEqual(LIB.nf_pool_create_from_string(ctypes.byref(pool), PLAIN_CONF.encode()), 0)
        try:
            got = []
            for _ in range(12):
                q = LIB.nf_alloc(pool, 4 * MiB, None)
                if not q:
                    break
                got.append(q)
            self.assertLess(len(got), 12)
            self.assertEqual(LIB.nf_last_status(), _lib.NF_ERR_OOM)
            self.assertIsNone(LIB.nf_alloc(pool, 48 * MiB, None))
            st = nofrag.pool_stats(pool)
            self.assertEqual((st["spilled"], st["spills"]), (0, 0))
            self.assertGreaterEqual(st["ooms"], 2)
            for q in got:
                LIB.nf_free(pool, q)
        finally:
            LIB.nf_pool_destroy(pool)

    def test_spill_limit_bounds_host_memory(self):
        pool = ctypes.c_void_p()
        conf = (SPILL_CONF + ",spill_limit:8MiB").encode()
        self.assertEqual(LIB.nf_pool_create_from_string(ctypes.byref(pool), conf), 0, _lib.last_error())
        try:
            self.assertIsNone(LIB.nf_alloc(pool, 48 * MiB, None))  # 32 + 8 < 48
            self.assertEqual(LIB.nf_last_status(), _lib.NF_ERR_OOM)
            q = LIB.nf_alloc(pool, 36 * MiB, None)  # 32 + 8 >= 36 (+ edge granules)
            self.assertTrue(q, _lib.last_error())
            st = nofrag.pool_stats(pool)
            self.assertLessEqual(st["spilled"], 8 * MiB)
            self.assertGreater(st["spilled"], 0)
            LIB.nf_free(pool, q)
        finally:
            LIB.nf_pool_destroy(pool)


if __name__ == "__main__":
    unittest.main()
