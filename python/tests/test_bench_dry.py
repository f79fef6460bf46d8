"""bench/gpu's --dry-run (no torch, no GPU) writes results that cannot be taken
for measurements: "dry_run": true at the top and in every run (every rank),
the DRY RUN banner in the Markdown, and none of the old plausible figures."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GPU = os.path.join(ROOT, "bench", "gpu")


@unittest.skipUnless(os.path.isdir(GPU), "bench/gpu is not beside these tests (run from a copy outside the checkout)")
class DryRunMarked(unittest.TestCase):
    def check(self, script, *args):
        with tempfile.TemporaryDirectory() as out:
            p = subprocess.run([sys.executable, os.path.join(GPU, script), "--dry-run", "--out", out, *args],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
            self.assertEqual(p.returncode, 0, p.stdout[-3000:])
            with open(os.path.join(out, "results.json")) as f:
                r = json.load(f)
            with open(os.path.join(out, "results.md")) as f:
                md = f.read()
        self.assertIs(r.get("dry_run"), True)
        runs = r["runs"].values() if isinstance(r["runs"], dict) else r["runs"]
        for run in runs:
            if run.get("status", "").startswith("skipped"):
                continue
            for d in run.get("ranks") or [run]:
                self.assertIs(d.get("dry_run"), True, f"{script}: {d.get('model')} {d.get('alloc')} not marked")
        self.assertIn("DRY RUN — not measured", md.split("\n", 4)[2])
        for old in ("1.17", "1.004", "1.001", "0.17"):  # the fixed figures that read like measurements
            self.assertNotIn(f"| {old}", md)
        return r

    def test_train(self):
        self.check("train.py", "--models", "gpt2", "--no-limits")

    def test_dist(self):
        self.check("dist.py", "--models", "gpt2")

    def test_spill(self):
        self.check("spill.py")


if __name__ == "__main__":
    unittest.main()
