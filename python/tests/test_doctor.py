"""`python3 -m nofrag doctor`: the package's own checks joined to the
`nofrag` command's, in one verdict (no GPU needed: the driver situations come
from the stand-in libcuda.so.1 that the C tests build, tests/fake_cuda).

    NOFRAG_LIB=build/libnofrag.so python3 -m unittest python.tests.test_doctor
"""
import importlib.util
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, PKG)

from nofrag import _lib, doctor  # noqa: E402


def run(*args, env=None):
    e = dict(os.environ, PYTHONPATH=PKG, **(env or {}))
    r = subprocess.run([sys.executable, "-m", "nofrag", "doctor"] + list(args), capture_output=True, text=True,
                       env=e, timeout=300)
    return r


@unittest.skipUnless(doctor._cli_path(), "no `nofrag` command next to the library")
class TestDoctor(unittest.TestCase):
    def checks(self, r):
        d = json.loads(r.stdout)
        return d, {c["name"]: c for c in d["checks"]}

    def test_joins_package_and_command(self):
        r = run("--json")
        d, c = self.checks(r)
        self.assertEqual(c["package"]["status"], "ok", c["package"])
        self.assertIn(_lib.path(), c["package"]["detail"])
        self.assertEqual(c["library"]["status"], "ok", c["library"])  # the command's host self-test
        self.assertIn("driver", c)
        # One verdict: the exit status follows the failures of both sides.
        self.assertEqual(d["failed"], sum(x["status"] == "fail" for x in d["checks"]))
        self.assertEqual(r.returncode, 1 if d["failed"] else 0, r.stderr)

    def test_driver_findings_come_through(self):
        fake = os.path.join(os.path.dirname(_lib.path()), "tests", "fake_cuda")
        if not os.path.exists(os.path.join(fake, "libcuda.so.1")):
            self.skipTest("the stand-in driver is not built (tests/fake_cuda)")
        r = run("--json", env={"LD_LIBRARY_PATH": fake, "NF_FAKE_CUDA": "devices=2,vmm1=0"})
        d, c = self.checks(r)
        self.assertEqual(c["driver"]["status"], "ok", c["driver"])
        self.assertEqual(c["cuda:1"]["status"], "fail")
        self.assertIn("no virtual memory management", c["cuda:1"]["detail"])
        self.assertEqual(r.returncode, 1)
        r = run("--json", "--device", "1", env={"LD_LIBRARY_PATH": fake, "NF_FAKE_CUDA": "devices=2,vmm1=0"})
        _, c = self.checks(r)
        self.assertNotIn("cuda:0", c)  # --device reaches the command

    def test_config_device_reaches_the_driver(self):
        # backend:cuda,device:N opens GPU N (src/backend/common.c): against the
        # stand-in driver with one device, device:1 fails at cuDeviceGet(1);
        # device:0 works (the stand-in's VMM on host memory): a block through
        # the Python pool, written and read back through its address.
        fake = os.path.join(os.path.dirname(_lib.path()), "tests", "fake_cuda")
        if not os.path.exists(os.path.join(fake, "libcuda.so.1")):
            self.skipTest("the stand-in driver is not built (tests/fake_cuda)")
        code = ("import ctypes, nofrag, sys\ntry:\n    p = nofrag.Pool(sys.argv[1])\nexcept nofrag.NofragError as e:\n"
                "    print(e)\n    sys.exit()\nb = p.alloc(5 << 20)\nctypes.memset(b, 0x5a, 5 << 20)\n"
                "print('read back', ctypes.string_at(b + (5 << 20) - 1, 1) == b'Z')\np.free(b)\n")
        for conf, want in (("backend:cuda,device:1", "cuDeviceGet(1): CUDA_ERROR_INVALID_DEVICE"),
                           ("backend:cuda,device:0", "read back True")):
            r = subprocess.run([sys.executable, "-c", code, conf], capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, PYTHONPATH=PKG, LD_LIBRARY_PATH=fake, NF_FAKE_CUDA="devices=1"))
            self.assertIn(want, r.stdout, (conf, r.stdout, r.stderr))

    def test_bad_arguments(self):
        for args in (["--bogus"], ["--device"], ["--device", "x"]):
            r = run(*args)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            self.assertTrue(r.stderr.strip(), args)
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("usage: python3 -m nofrag doctor", r.stdout)

    def test_cli_override(self):
        # NOFRAG_CLI names the command; a wrong one fails, naming it, rather
        # than another `nofrag` being run in its place. The one run is named.
        r = run("--json", env={"NOFRAG_CLI": "/nonexistent/nofrag"})
        d, c = self.checks(r)
        self.assertEqual(c["command"]["status"], "fail", c)
        self.assertIn("NOFRAG_CLI='/nonexistent/nofrag'", c["command"]["detail"])
        self.assertNotIn("driver", c)
        self.assertEqual(r.returncode, 1)
        exe = doctor._cli_path()
        r = run("--json", env={"NOFRAG_CLI": exe})
        _, c = self.checks(r)
        self.assertEqual(c["command"], {"name": "command", "status": "ok", "detail": f"{exe} doctor", "hint": ""})

    @unittest.skipIf(importlib.util.find_spec("torch"), "torch is installed")
    def test_build_adapter_without_torch(self):
        r = run("--json", "--build-adapter")
        _, c = self.checks(r)
        self.assertEqual(c["adapter"]["status"], "fail", c)
        self.assertIn("without torch", c["adapter"]["detail"])
        self.assertEqual(r.returncode, 1)

    def test_text_form(self):
        r = run()
        self.assertIn("nofrag doctor (python)", r.stdout)
        self.assertRegex(r.stdout, r"\n  ok    package ")
        self.assertTrue(r.stdout.rstrip().endswith(("Nothing failed.", "check(s) failed.")), r.stdout)


if __name__ == "__main__":
    unittest.main()
