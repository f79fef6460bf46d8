"""nofrag.cupy without CuPy or a GPU: a fake ``cupy`` module (the few names
nofrag.cupy uses, with CuPy's signatures) is put in sys.modules, and the pool
is forced onto the host backend so that the addresses are real memory.

    NOFRAG_LIB=build/libnofrag.so python3 -m unittest discover -s python/tests -v

The real thing runs on the GPU machine: bench/gpu/cupy_frag.py.
"""

import ctypes
import gc
import os
import sys
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

import nofrag  # noqa: E402

MiB = 1 << 20


def fake_cupy():
    cp = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    cp.cuda = cuda
    state = {"allocator": None, "device": 0, "stream": types.SimpleNamespace(ptr=0)}

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id=-1):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    class OutOfMemoryError(MemoryError):
        def __init__(self, size, total, limit=0):
            super().__init__(f"Out of memory allocating {size} bytes (allocated so far: {total} bytes, limit "
                             f"set to: {limit} bytes).")

    class DefaultPool:
        def malloc(self, size):
            return "cupy-default"

    default_pool = DefaultPool()
    cuda.UnownedMemory, cuda.MemoryPointer = UnownedMemory, MemoryPointer
    cuda.memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError)
    cuda.runtime = types.SimpleNamespace(getDevice=lambda: state["device"])
    cuda.get_current_stream = lambda: state["stream"]
    cuda.set_allocator = lambda fn: state.__setitem__("allocator", fn)
    cp.get_default_memory_pool = lambda: default_pool
    return cp, state


class Stream:
    """A CuPy stream object as nofrag.cupy sees it: CuPy destroys the CUDA
    stream when the object goes."""

    def __init__(self, ptr):
        self.ptr = ptr


class TestCupy(unittest.TestCase):
    def setUp(self):
        self.cp, self.state = fake_cupy()
        self._saved = sys.modules.get("cupy")
        sys.modules["cupy"] = self.cp
        import nofrag.cupy
        self.nfc = nofrag.cupy
        self.addCleanup(self.restore)

    def restore(self):
        self.nfc.disable()
        if self._saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = self._saved
        gc.collect()

    def test_enable_routes_allocations_and_frees_on_release(self):
        pool = self.nfc.enable(backend="host", limit="64MiB")
        self.assertTrue(self.nfc.enabled())
        self.assertIs(self.nfc.pool(), pool)
        self.assertIn("backend:host", pool.config())
        malloc = self.state["allocator"]
        mp = malloc(3 * MiB)
        self.assertIsInstance(mp, self.cp.cuda.MemoryPointer)
        self.assertEqual(mp.mem.size, 3 * MiB)
        self.assertEqual(mp.mem.device_id, 0)
        ctypes.memset(mp.ptr, 7, 3 * MiB)  # real (host-backend) memory
        self.assertEqual(pool.stats()["live"], 3 * MiB)
        self.assertEqual(pool.block_size(mp.ptr), 3 * MiB)
        del mp  # CuPy drops its last reference: the owner frees the block
        gc.collect()
        st = pool.stats()
        self.assertEqual((st["live"], st["frees"]), (0, 1))

    def test_enable_without_arguments_reads_nofrag_conf(self):
        # As nofrag.torch.enable() and nofrag.Pool(): no arguments, the
        # environment's configuration (it was ignored: a CUDA pool with defaults).
        with mock.patch.dict(os.environ, {"NOFRAG_CONF": "backend:host,limit:32MiB"}):
            pool = self.nfc.enable()
        self.assertIn("backend:host", pool.config())
        self.assertIn("limit:33554432", pool.config())
        # Arguments given: the environment is not read.
        self.nfc.disable()
        with mock.patch.dict(os.environ, {"NOFRAG_CONF": "limit:32MiB"}):
            pool = self.nfc.enable(backend="host", limit="64MiB")
        self.assertIn("limit:67108864", pool.config())

    def test_default_backend_is_cuda_on_current_device(self):
        """Without a backend key the pool is CUDA on CuPy's current device:
        here (no GPU) that fails in the CUDA backend, not in the config."""
        self.state["device"] = 3
        try:
            pool = self.nfc.enable(limit="64MiB")
        except nofrag.NofragError as e:
            self.assertIn(e.status_name, ("NF_ERR_BACKEND", "NF_ERR_UNSUPPORTED", "NF_ERR_INVALID"), str(e))  # INVALID: a GPU machine without that device
            self.assertIn("device:3", str(e))
            self.assertFalse(self.nfc.enabled())
            self.assertIsNone(self.state["allocator"])
            return
        self.assertIn("backend:cuda", pool.config())  # a machine with a GPU 3
        self.assertIn("device:3", pool.config())

    def test_device_id_follows_config(self):
        # A configuration naming a device keeps nofrag there: memory handed to
        # CuPy while another device is current would be the wrong device's.
        self.state["device"] = 2
        self.nfc.enable(backend="host", device=2, limit="64MiB")
        mp = self.state["allocator"](MiB)
        self.assertEqual(mp.mem.device_id, 2)
        self.state["device"] = 0
        with self.assertRaises(RuntimeError) as cm:
            self.state["allocator"](MiB)
        self.assertIn("device 0", str(cm.exception))
        self.assertEqual(list(self.nfc.pools()), [2])

    def test_device_none_does_not_pin(self):
        # device=None is no device key (conf_string drops it): every device
        # still gets its own pool (it raised RuntimeError on device 1).
        self.nfc.enable(backend="host", limit="64MiB", device=None)
        a = self.state["allocator"](MiB)
        self.state["device"] = 1
        b = self.state["allocator"](MiB)
        self.assertEqual((a.mem.device_id, b.mem.device_id), (0, 1))
        self.assertEqual(sorted(self.nfc.pools()), [0, 1])
        del a, b

    def test_each_device_gets_its_own_pool(self):
        # CuPy's allocator is process-wide; a pool serves one device. Under
        # cupy.cuda.Device(1) the memory must be device 1's, from its own pool.
        first = self.nfc.enable(backend="host", limit="64MiB")
        a = self.state["allocator"](MiB)
        self.state["device"] = 1
        b = self.state["allocator"](2 * MiB)
        self.assertEqual((a.mem.device_id, b.mem.device_id), (0, 1))
        pools = self.nfc.pools()
        self.assertEqual(sorted(pools), [0, 1])
        self.assertIs(pools[0], first)
        self.assertIs(self.nfc.pool(), first)
        self.assertIs(self.nfc.pool(1), pools[1])
        self.assertIsNot(pools[1], first)
        self.assertEqual(pools[1].stats()["live"], 2 * MiB)
        self.assertEqual(first.stats()["live"], MiB)
        self.assertIn("limit:67108864", pools[1].config())  # the same configuration
        z = self.state["allocator"](0)
        self.assertEqual(z.mem.device_id, 1)
        del a, b
        gc.collect()
        self.assertEqual((first.stats()["live"], pools[1].stats()["live"]), (0, 0))
        self.nfc.disable()
        self.assertEqual(self.nfc.pools(), {})

    def test_oom_is_cupys_error(self):
        os.environ.setdefault("NOFRAG_QUIET_OOM", "1")
        self.nfc.enable(backend="host", limit="8MiB")
        with self.assertRaises(self.cp.cuda.memory.OutOfMemoryError) as cm:
            self.state["allocator"](64 * MiB)
        self.assertIsInstance(cm.exception.__cause__, nofrag.NofragError)

    def test_stream_is_cupys_current(self):
        pool = self.nfc.enable(backend="host", limit="64MiB")
        self.state["stream"] = types.SimpleNamespace(ptr=0x1234)  # host backend: streams are opaque tags
        mp = self.state["allocator"](MiB)
        snap = pool.snapshot()
        streams = [b["stream"] for c in snap["chunks"] for b in c["blocks"] if b["state"] == "live"]
        self.assertEqual(streams, ["0x1234"])
        del mp

    def test_streams_kept_alive_while_known(self):
        """A stream made per step (``with cupy.cuda.Stream()``): the pool may
        record events on a stream it knows, so nofrag.cupy keeps the stream
        object alive until the pool has forgotten it (a 65th stream makes it
        forget those no live block names); then CuPy may destroy it."""
        import weakref
        pool = self.nfc.enable(backend="host", limit="64MiB")

        refs = []
        for i in range(300):
            st = Stream(0x10000 + i)
            refs.append(weakref.ref(st))
            self.state["stream"] = st
            mp = self.state["allocator"](MiB)
            ctypes.memset(mp.ptr, i & 0xFF, MiB)
            del mp, st
            gc.collect()
        self.state["stream"] = types.SimpleNamespace(ptr=0)
        alive = [r() for r in refs if r() is not None]
        # Every stream the pool still knows is alive; the rest were let go.
        for i, r in enumerate(refs):
            if pool.stream_known(0x10000 + i):
                self.assertIsNotNone(r(), f"stream {i} is known to the pool but was let go")
        self.assertLess(len(alive), 64 + 16 + 1)  # the others were released
        self.assertGreater(300 - len(alive), 200)
        self.assertEqual(pool.stats()["live"], 0)
        pool.check()

    def test_streams_past_64_with_live_blocks(self):
        """More than 64 streams each holding a live array (a stream per
        request): every allocation succeeds (the pool takes the least recently
        used stream's slot), every stream stays alive while the pool knows it
        (its live block's does), and all are let go once the arrays are."""
        import weakref
        pool = self.nfc.enable(backend="host", limit="256MiB")

        refs, mps = [], []
        for i in range(150):
            st = Stream(0x20000 + i)
            refs.append(weakref.ref(st))
            self.state["stream"] = st
            mp = self.state["allocator"](MiB)
            ctypes.memset(mp.ptr, i & 0xFF, MiB)
            mps.append(mp)
            del st
        self.state["stream"] = types.SimpleNamespace(ptr=0)
        gc.collect()
        for i, r in enumerate(refs):
            self.assertTrue(pool.stream_known(0x20000 + i), f"stream {i}: a live block names it")
            self.assertIsNotNone(r(), f"stream {i} is known to the pool but was let go")
        for i, mp in enumerate(mps):
            self.assertEqual(ctypes.string_at(mp.ptr, 1), bytes([i & 0xFF]))
        pool.check()
        del mp
        mps.clear()
        gc.collect()
        for i in range(100):  # new streams: the forgotten ones go
            st = Stream(0x30000 + i)
            self.state["stream"] = st
            del st
            self.state["allocator"](MiB)
            gc.collect()
        self.state["stream"] = types.SimpleNamespace(ptr=0)
        gc.collect()
        self.assertLess(sum(r() is not None for r in refs), 64)
        self.assertEqual(pool.stats()["live"], 0)
        pool.check()

    def test_streams_held_after_disable(self):
        """disable() drops the allocator (and with it what held the streams),
        but the pool lives on while CuPy holds its blocks, and may still
        record events on their streams: those must stay alive."""
        import weakref
        pool = self.nfc.enable(backend="host", limit="64MiB")

        st = Stream(0x4321)
        ref = weakref.ref(st)
        self.state["stream"] = st
        mp = self.state["allocator"](MiB)  # live on st: the pool knows it
        self.state["stream"] = types.SimpleNamespace(ptr=0)
        del st
        self.nfc.disable()
        gc.collect()
        self.assertTrue(pool.stream_known(0x4321))
        self.assertIsNotNone(ref(), "a stream the pool knows was let go at disable()")
        del mp
        gc.collect()

    def test_stream_held_when_known_again_during_prune(self):
        """A prune that found a stream forgotten must not drop it once
        another thread's allocation on it made the pool know it again (its
        hold() saw the stream still held and returned)."""
        import threading
        import weakref
        pool = self.nfc.enable(backend="host", limit="64MiB")
        malloc = self.state["allocator"]

        target = Stream(0x20000)
        ref = weakref.ref(target)
        self.state["stream"] = target
        malloc(MiB)  # held; freed at once: nothing live names it
        cls = type(pool)
        orig = cls.stream_known
        box = {}
        other = threading.Thread(target=lambda: box.setdefault("mp", malloc(MiB)))

        def known(self_, s):
            r = orig(self_, s)
            if s == 0x20000 and not r and not other.is_alive() and "mp" not in box:
                other.start()  # another thread allocates on it right now
                other.join(0.5)
            return r

        threads_stream = threading.local()
        cupy_stream = self.cp.cuda.get_current_stream
        self.cp.cuda.get_current_stream = lambda: getattr(threads_stream, "s", target)
        cls.stream_known = known
        try:
            for i in range(200):  # forgotten at a 65th; the prune follows
                threads_stream.s = Stream(0x30000 + i)
                malloc(MiB)
                if other.ident is not None:
                    break
        finally:
            cls.stream_known = orig
            self.cp.cuda.get_current_stream = cupy_stream
        other.join()
        threads_stream.s = None
        self.state["stream"] = types.SimpleNamespace(ptr=0)
        self.assertIn("mp", box)
        del target
        gc.collect()
        self.assertTrue(pool.stream_known(0x20000))  # box["mp"] is live on it
        self.assertIsNotNone(ref(), "a stream the pool knows was let go")
        del box["mp"]
        gc.collect()

    def test_enable_twice_and_disable(self):
        self.nfc.enable(backend="host", limit="64MiB")
        with self.assertRaises(RuntimeError):
            self.nfc.enable(backend="host")
        mp = self.state["allocator"](MiB)  # outlives disable()
        pool = self.nfc.pool()
        self.nfc.disable()
        self.assertFalse(self.nfc.enabled())
        self.assertEqual(self.state["allocator"](1), "cupy-default")
        self.assertEqual(pool.stats()["live"], MiB)
        ctypes.memset(mp.ptr, 1, MiB)  # still valid memory
        with self.assertRaises(RuntimeError):
            self.nfc.pool()

    def test_zero_size(self):
        self.nfc.enable(backend="host", limit="64MiB")
        mp = self.state["allocator"](0)
        self.assertEqual(mp.ptr, 0)


if __name__ == "__main__":
    unittest.main()
