"""nofrag.torch_trace: PyTorch memory snapshot pickle -> text trace (stdlib only).

    python3 -m unittest discover -s python/tests -v
"""

import gzip
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, PYDIR)

from nofrag import torch_trace as snapshot  # noqa: E402

SHARED = os.environ.get("NF_SHARED", os.path.join(PYDIR, "..", "..", "shared"))
REAL = os.path.join(SHARED, "traces", "gpt2_small_snapshot.pickle.gz")


def entry(action, addr, size, stream=0, t=1):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t, "frames": []}


class TestPickleConvert(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def write_pickle(self, obj, name="s.pickle"):
        p = self.path(name)
        with open(p, "wb") as f:
            pickle.dump(obj, f)
        return p

    def read_lines(self, p):
        opener = gzip.open if p.endswith(".gz") else open
        with opener(p, "rt") as f:
            return [ln.rstrip("\n") for ln in f if not ln.startswith("#")]

    def test_site_is_first_frame_outside_torch(self):
        torch = {"filename": "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", "line": 1790,
                 "name": "_call_impl"}
        user = {"filename": "/venv/lib/python3.12/site-packages/transformers/activations.py", "line": 66,
                "name": "forward"}
        self.assertEqual(snapshot.site_of([torch, user, torch]), ("transformers/activations.py:66", "forward"))
        self.assertEqual(snapshot.site_of([torch]), ("torch/nn/modules/module.py:1790", "_call_impl"))
        self.assertIsNone(snapshot.site_of([]))
        self.assertIsNone(snapshot.site_of("junk"))
        self.assertEqual(snapshot.site_of([{"filename": "a\tb.py", "line": 3}]), ("a b.py:3", "?"))

    @unittest.skipUnless(os.path.exists(REAL), "shared snapshot not found")
    def test_real_snapshot_site_lines(self):
        out = self.path("real.trace")
        snapshot.convert(REAL, out)
        with open(out, encoding="utf-8") as f:
            raw = [ln.rstrip("\n") for ln in f]
        sites = [(k, ln) for k, ln in enumerate(raw) if ln.startswith("#site\t")]
        self.assertGreater(len(sites), 1000)  # allocs with a Python stack (backward ones have none)
        for k, ln in sites:
            self.assertTrue(raw[k - 1].startswith("alloc "), raw[k - 1])  # right after its alloc
            _, site, _func = ln.split("\t")
            path, _, line = site.rpartition(":")
            self.assertTrue(path and line.isdigit(), site)

    @unittest.skipUnless(os.path.exists(REAL), "shared snapshot not found")
    def test_real_snapshot_converts_every_entry(self):
        out = self.path("real.trace.gz")
        st = snapshot.convert(REAL, out)
        lines = self.read_lines(out)
        self.assertEqual(len(lines), 9139)  # every entry of device_traces[0]
        self.assertEqual(st["lines"], 9139)
        counts = {}
        for ln in lines:
            f = ln.split()
            self.assertEqual(len(f), 5)
            self.assertTrue(all(x.isdigit() for x in f[1:]))
            counts[f[0]] = counts.get(f[0], 0) + 1
        self.assertEqual(counts, {"alloc": 3175, "free_requested": 2942, "free_completed": 2942,
                                  "segment_alloc": 80})
        # Same fields, in the same order, as the pickle holds.
        snap = snapshot.load(REAL)
        e = snap["device_traces"][0][1]
        self.assertEqual(lines[1], f"{e['action']} {e['addr']} {e['size']} {e['stream']} {e['time_us']}")

    def test_markers_skipped_and_early_frees_dropped(self):
        snap = {"segments": [], "device_traces": [[
            entry("free_completed", 5, 10),       # allocated before the ring buffer began
            entry("segment_free", 7, 100),
            {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 2},
            entry("segment_alloc", 100, 2 << 20),
            entry("alloc", 100, 512, 3),
            entry("free_requested", 100, 512),
            entry("free_completed", 100, 512),
            entry("segment_free", 100, 2 << 20),
        ]]}
        out = self.path("o.trace")
        st = snapshot.convert(self.write_pickle(snap), out)
        self.assertEqual(st, {"lines": 5, "skipped": 1, "dropped_frees": 2})
        self.assertEqual(self.read_lines(out)[1], "alloc 100 512 3 1")

    def test_malformed_entries_named(self):
        for bad, what in ((entry("alloc", -1, 5), "'addr'"), (entry("explode", 1, 1), "unknown action"),
                          ({"action": "alloc", "addr": 1, "size": "9", "stream": 0}, "'size'")):
            p = self.write_pickle({"device_traces": [[entry("alloc", 8, 8), bad]]})
            with self.assertRaises(snapshot.SnapshotError) as cm:
                snapshot.convert(p, self.path("x.trace"))
            self.assertIn("entry 1", str(cm.exception))
            self.assertIn(what, str(cm.exception))
            self.assertFalse(os.path.exists(self.path("x.trace")))

    def test_not_a_snapshot(self):
        for obj in ([1, 2], {"segments": []}, "text"):
            with self.assertRaises(snapshot.SnapshotError):
                snapshot.load(self.write_pickle(obj))
        p = self.path("junk")
        with open(p, "wb") as f:
            f.write(b"\x80\x04garbage")
        with self.assertRaises(snapshot.SnapshotError):
            snapshot.load(p)

    def test_device_traces_elements_checked(self):
        # {'device_traces': [None]} was a raw TypeError (CLI exit 1, traceback).
        env = dict(os.environ, PYTHONPATH=PYDIR)
        for traces in ([None], [5], [{"a": 1}], ["alloc"]):
            p = self.write_pickle({"device_traces": traces})
            with self.assertRaises(snapshot.SnapshotError, msg=repr(traces)) as cm:
                snapshot.convert(p, self.path("x.trace"))
            self.assertIn("device_traces[0]", str(cm.exception))
            r = subprocess.run([sys.executable, "-m", "nofrag.torch_trace", p, self.path("x.trace")], env=env,
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertNotIn("Traceback", r.stderr)
            self.assertFalse(os.path.exists(self.path("x.trace")))
        snap = {"device_traces": [[], [entry("alloc", 1, 2)]]}
        for dev in (True, 1.0, "1"):  # device indexes are ints, not bool (True would be device 1)
            with self.assertRaises(snapshot.SnapshotError, msg=repr(dev)):
                list(snapshot.iter_lines(snap, dev))
        self.assertEqual(list(snapshot.iter_lines(snap, 1)), ["alloc 1 2 0 1"])

    def test_failed_write_leaves_no_tmp(self):
        # Writing fails partway (disk full) or the final rename fails: neither
        # dst nor dst.tmp may be left behind.
        import types
        from unittest import mock
        p = self.write_pickle({"device_traces": [[entry("alloc", i * 512, 512) for i in range(1, 50)]]})
        out = self.path("y.trace.gz")

        def failing_open(path, mode, **kw):
            f = gzip.open(path, mode, **kw)
            n = [0]
            real_write = f.write

            def write(data):
                n[0] += 1
                if n[0] > 5:
                    raise OSError(28, "No space left on device")
                return real_write(data)
            f.write = write
            return f

        fake_gzip = types.SimpleNamespace(open=failing_open)
        with mock.patch.object(snapshot, "gzip", fake_gzip), self.assertRaises(OSError):
            snapshot.convert(p, out)
        self.assertEqual(sorted(os.listdir(self.tmp.name)), ["s.pickle"])
        with mock.patch.object(snapshot.os, "replace", side_effect=OSError(18, "Invalid cross-device link")), \
                self.assertRaises(OSError):
            snapshot.convert(p, out)
        self.assertEqual(sorted(os.listdir(self.tmp.name)), ["s.pickle"])
        snapshot.convert(p, out)  # and it still works
        self.assertEqual(len(self.read_lines(out)), 49)

    def test_corrupt_lengths_are_clean_errors(self):
        # Found by fuzz/fuzz_pickle.py: a corrupt length field made the
        # unpickler raise MemoryError (a huge buffer) or OverflowError (a FRAME
        # length), which escaped as tracebacks instead of SnapshotError.
        good = pickle.dumps({"device_traces": []}, protocol=4)
        frame = b"\x80\x04\x95" + (1 << 63).to_bytes(8, "little") + good[11:]
        huge = b"\x80\x04\x95\x16\x4b\x40\xae\x3a\xc1\x27\x72" + bytes(8) + good[19:]
        for name, data in (("frame", frame), ("huge", huge)):
            p = self.path(name)
            with open(p, "wb") as f:
                f.write(data)
            with self.assertRaises(snapshot.SnapshotError, msg=name) as cm:
                snapshot.load(p)
            self.assertIn("not a readable snapshot pickle", str(cm.exception))

    def test_globals_refused(self):
        # A pickle that would call os.system on load must not run it.
        class Evil:
            def __reduce__(self):
                return (os.system, ("true",))
        p = self.write_pickle({"device_traces": [[Evil()]]})
        with self.assertRaises(snapshot.SnapshotError) as cm:
            snapshot.load(p)
        self.assertIn("not allowed", str(cm.exception))

    def test_command_line(self):
        p = self.write_pickle({"device_traces": [[entry("alloc", 1, 2)]]})
        out = self.path("c.trace.gz")
        env = dict(os.environ, PYTHONPATH=PYDIR)
        for mod in (["-m", "nofrag.torch_trace"], ["-m", "nofrag", "torch_trace"], ["-m", "nofrag", "snapshot"]):
            r = subprocess.run([sys.executable] + mod + [p, out], env=env, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(self.read_lines(out), ["alloc 1 2 0 1"])
            # nofrag/__init__ imports torch_trace lazily: runpy has no
            # "found in sys.modules" RuntimeWarning to print.
            self.assertNotIn("Warning", r.stderr)
        r = subprocess.run([sys.executable, "-m", "nofrag.torch_trace", p], env=env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("usage", r.stderr)
        # -h / --help: the usage on stdout, exit 0 (the package's and the converter's).
        for mod in (["-m", "nofrag"], ["-m", "nofrag.torch_trace"], ["-m", "nofrag", "torch_trace"]):
            for opt in ("-h", "--help"):
                r = subprocess.run([sys.executable] + mod + [opt], env=env, capture_output=True, text=True)
                self.assertEqual((r.returncode, r.stderr), (0, ""), mod + [opt])
                self.assertIn("usage", r.stdout)
        r = subprocess.run([sys.executable, "-m", "nofrag"], env=env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("usage", r.stderr)
        # An output that cannot be written: the error names it, not its .tmp.
        bad = os.path.join(self.tmp.name, "no-such-dir", "o.trace")
        r = subprocess.run([sys.executable, "-m", "nofrag.torch_trace", p, bad], env=env, capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"cannot write {bad}: ", r.stderr)
        self.assertNotIn(".tmp", r.stderr)


if __name__ == "__main__":
    unittest.main()
