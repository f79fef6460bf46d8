#!/usr/bin/env python3
"""nofrag as a first-class PyTorch allocator (issue 12): every case native vs
nofrag, on one GPU, within one time budget.

Orchestrator (bench/gpu/run_torch.sh runs it after building libnofrag):

    python3 bench/gpu/torch_features.py --out $OUT --budget 420 [--dry-run]

Every (case, allocator) runs in its own subprocess with a timeout (a crash or
a hang loses only that cell); results.json / results.md are rewritten after
each. Allocators: native (PyTorch's), nofrag (the C++ adapter,
src/torch/adapter*.{h,cpp}, built first: its compile log is printed on failure),
nofrag-ctypes (today's CUDAPluggableAllocator path, NOFRAG_ADAPTER=0) where the
case is meant to show what the adapter fixes.

Cases:
 1 graph    capture freeing a temporary inside the graph, tensors allocated
            outside afterwards, replays: no outside tensor may change
 2 graphed  make_graphed_callables on a transformer block, 20 training steps:
            losses vs native (bit-identical or largest difference)
 2 compile  torch.compile(mode="reduce-overhead") on a small GPT-2, 20 steps
 3 cudnn    cudnn.benchmark=True: a conv net and ViT-B/16, median step time
 4 history  _record_memory_history -> _snapshot/_dump_snapshot -> _memory_viz
            trace_plot/segment_plot; `nofrag replay` of the dump: its live peak
            vs the run's (both net of the live memory when recording began)
 5 oom      except torch.OutOfMemoryError, then 5 training steps
 6 ipc      torch.multiprocessing (spawn) shares a CUDA tensor both ways; nofrag's
            live bytes back to 0 once both dropped it (pidfd_getfd: needs ptrace
            access between the processes)
 7 mempool  MemPool + use_mem_pool: allocations in the pool, freed with it
 8 train    bench/gpu/train.py gpt2 (issue 3): native / nofrag / nofrag-ctypes
 pair       CPU cost of torch.empty + del (ns per pair), native vs nofrag
 streams    100 streams (ExternalStream) holding live tensors at once, more than
            nofrag's 64 slots; each freed with work queued and its memory taken
            by another stream: every tensor must read its own value
 capture_race  graphs captured in one thread while another drops MemPools:
            no capture may break (a pool's last release waits for the device)
 late_install  the adapter installed after CUDA is initialised (native run):
            refused with PyTorch's reason, the plug-in's raising left on
 llama      a trace of a Llama-style 1.1B with 4-micro-batch gradient
            accumulation and activation checkpointing under the native
            allocator, gzipped into $OUT (for `nofrag replay --allocator native`)

--dry-run: no torch, no GPU: the orchestration only, every cell marked DRY RUN.
"""
import argparse
import faulthandler
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import ROOT, base_env  # noqa: E402
# The workers live in two sibling modules (files stay small).
from torch_features_api import (case_capture_race, case_contract, case_ipc, case_late_install,  # noqa: E402
                                case_mempool, case_oom, case_streams)
from torch_features_cases import (case_compile, case_compile_history, case_cudnn, case_graph,  # noqa: E402
                                  case_graphed, case_history, case_llama, case_pair, setup)


# ================================================================ workers

CASES = {"pair": case_pair, "graph": case_graph, "graphed": case_graphed, "compile": case_compile, "cudnn": case_cudnn,
         "history": case_history, "oom": case_oom, "ipc": case_ipc, "mempool": case_mempool, "llama": case_llama,
         "contract": case_contract, "streams": case_streams, "compile_history": case_compile_history,
         "capture_race": case_capture_race, "late_install": case_late_install}


def worker(a):
    faulthandler.enable()  # a crash prints the Python stack (and the adapter's native frames) into the log
    res = {"case": a.case, "alloc": a.alloc, "status": "started"}

    def dump():
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    dump()
    try:
        torch, info = setup(a.alloc)
        res["install"] = {k: (v if isinstance(v, (str, bool, int, type(None))) else str(v)) for k, v in info.items()}
        res["torch"] = torch.__version__
        fn = CASES[a.case]
        out = fn(torch, a.alloc, a.out) if a.case in ("history", "llama") else fn(torch, a.alloc)
        res.update(out)
        res["status"] = "ok"
    except BaseException as e:  # noqa: BLE001 - the cell records whatever happened
        res.update(status="error", error=f"{type(e).__name__}: {e}"[:1500], traceback=traceback.format_exc()[-3000:])
    dump()
    return 0 if res["status"] == "ok" else 1


# ================================================================ orchestrator

# (case, allocators, timeout s), in priority order.
PLAN = [("contract", ("native", "nofrag"), 90),
        ("graph", ("native", "nofrag", "nofrag-ctypes"), 90),
        ("oom", ("native", "nofrag"), 90),
        ("ipc", ("native", "nofrag"), 90),
        ("mempool", ("native", "nofrag"), 60),
        ("streams", ("native", "nofrag"), 90),
        ("capture_race", ("native", "nofrag"), 90),
        ("late_install", ("native",), 90),
        ("history", ("native", "nofrag"), 120),
        ("graphed", ("native", "nofrag"), 90),
        ("train", ("native", "nofrag", "nofrag-ctypes"), 150),
        ("cudnn", ("native", "nofrag", "native@2", "nofrag@2"), 120),
        ("compile", ("native", "nofrag"), 200),
        ("compile_history", ("native", "nofrag"), 200),
        ("llama", ("native",), 150),
        ("pair", ("native", "nofrag", "nofrag-ctypes", "native@2", "nofrag@2", "nofrag-ctypes@2"), 60)]


class Orchestrator:
    def __init__(self, a):
        self.a = a
        self.deadline = time.time() + a.budget
        self.results = {"dry_run": a.dry_run, "started": time.strftime("%F %T"), "budget_s": a.budget,
                        "adapter": None, "cells": {}}
        os.makedirs(os.path.join(a.out, "cells"), exist_ok=True)

    def left(self):
        return self.deadline - time.time()

    def save(self):
        with open(os.path.join(self.a.out, "torch_features.json"), "w") as f:
            json.dump(self.results, f, indent=1)
        with open(os.path.join(self.a.out, "torch_features.md"), "w") as f:
            f.write(table(self.results))

    def env(self, alloc):
        env = base_env("native" if alloc == "native" else "nofrag")
        if alloc == "nofrag-ctypes":
            env["NOFRAG_ADAPTER"] = "0"
        env["NOFRAG_ADAPTER_DIR"] = os.path.join(self.a.out, "adapter-build")
        env["PYTHONFAULTHANDLER"] = "1"  # also in spawned children (ipc)
        env["NOFRAG_SEGV_BACKTRACE"] = "1"  # the adapter prints native frames on a fatal signal
        return env

    def build_adapter(self):
        if self.a.dry_run:
            self.results["adapter"] = {"status": "DRY RUN (not built)"}
            return
        code = ("import json,sys; sys.path.insert(0, %r); from nofrag import torch_adapter as t; "
                "p, why = t.build_adapter(%r); print(json.dumps({'path': p, 'why': why}))"
                % (os.path.join(ROOT, "python"), os.path.join(self.a.out, "adapter-build")))
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=max(30, min(300, self.left() - 60)), env=self.env("nofrag"), cwd=ROOT)
            r = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {"why": p.stderr[-2000:]}
        except Exception as e:  # noqa: BLE001
            r = {"path": None, "why": f"{type(e).__name__}: {e}"}
        r["seconds"] = round(time.time() - t0, 1)
        self.results["adapter"] = r
        print(f"[{time.strftime('%T')}] adapter: {'built ' + r['path'] if r.get('path') else 'FAILED: ' + r['why']}"
              f" ({r['seconds']} s)", flush=True)
        if not r.get("path"):  # the compile log, so the failure can be fixed from this output
            for dirpath, _, files in os.walk(os.path.join(self.a.out, "adapter-build")):
                if "build.log" in files:
                    with open(os.path.join(dirpath, "build.log")) as f:
                        print("---- adapter build.log (tail) ----\n" + f.read()[-6000:], flush=True)
        self.save()

    def cell(self, case, alloc, timeout):
        key = f"{case}/{alloc}"
        alloc = alloc.split("@")[0]  # "native@2": a second round of the same cell, interleaved
        timeout = min(timeout, self.left() - 5)
        if timeout < 15:
            self.results["cells"][key] = {"status": "skipped (time budget)"}
            return
        if self.a.dry_run:
            self.results["cells"][key] = {"status": "DRY RUN", "cmd_timeout_s": round(timeout)}
            return
        jpath = os.path.join(self.a.out, "cells", key.replace("/", "-").replace("@", "-r") + ".json")
        if case == "train":
            cmd = [sys.executable, os.path.join(HERE, "train.py"), "worker", "--model", "gpt2", "--alloc",
                   "native" if alloc == "native" else "nofrag", "--steps", "20", "--json", jpath]
        else:
            cmd = [sys.executable, os.path.abspath(__file__), "worker", "--case", case, "--alloc", alloc,
                   "--json", jpath, "--out", self.a.out]
        t0 = time.time()
        with open(jpath[:-5] + ".log", "w") as log:
            try:
                rc = subprocess.run(cmd, env=self.env(alloc), stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                                    cwd=ROOT).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        try:
            with open(jpath) as f:
                res = json.load(f)
        except (OSError, ValueError):
            res = {}
        if rc == "timeout":
            res["status"] = f"timeout ({timeout:.0f}s)"
        elif res.get("status") in (None, "started", "running"):
            res["status"] = f"crash (rc {rc})"
        if res.get("status") != "ok":
            try:
                with open(jpath[:-5] + ".log") as f:
                    res["log_tail"] = f.read()[-1500:]
            except OSError:
                pass
        res["elapsed_s"] = round(time.time() - t0, 1)
        self.results["cells"][key] = res
        print(f"[{time.strftime('%T')}] {key}: {res['status']} in {res['elapsed_s']}s (left {self.left():.0f}s)",
              flush=True)
        self.save()

    def run(self):
        self.build_adapter()
        only = set(self.a.cases.split(",")) if self.a.cases else None
        for case, allocs, timeout in PLAN:
            if only and case not in only:
                continue
            for alloc in allocs:
                if self.a.allocs and alloc.split("@")[0] not in self.a.allocs.split(","):
                    continue
                self.cell(case, alloc, timeout)
        self.compare()
        self.save()
        print(table(self.results), flush=True)

    def compare(self):
        """Verdicts per case from the native and nofrag cells."""
        C = self.results["cells"]
        v = {}

        def get(case, alloc):
            return C.get(f"{case}/{alloc}", {})
        for case in ("graph", "oom", "mempool", "history", "ipc"):
            n, f = get(case, "native"), get(case, "nofrag")
            v[case] = {"native": n.get("pass"), "nofrag": f.get("pass")}
        v["graph"]["nofrag-ctypes (today)"] = get("graph", "nofrag-ctypes").get("pass")
        v["late_install"] = get("late_install", "native").get("pass")
        for case in ("graphed", "compile"):
            n, f = get(case, "native").get("losses"), get(case, "nofrag").get("losses")
            if n and f:
                diffs = [abs(float.fromhex(x) - float.fromhex(y)) for x, y in zip(n, f)]
                v[case] = {"bit_identical": n == f, "max_abs_diff": max(diffs), "steps": len(diffs)}
            else:
                v[case] = {"bit_identical": None}
        # cudnn: rounds interleaved (native, nofrag, native, nofrag), each cell its own
        # process; per model, the best median of each allocator's rounds.
        def best(alloc):
            b = {}
            for key, r in C.items():
                if key.split("@")[0] == f"cudnn/{alloc}":
                    for k, t in (r.get("median_step_s") or {}).items():
                        b[k] = min(t, b.get(k, t))
            return b
        n, f = best("native"), best("nofrag")
        if n and f:
            v["cudnn"] = {k: round(f[k] / n[k], 4) for k in n if k in f}
            v["cudnn"]["rounds"] = sum(1 for key in C if key.startswith("cudnn/nofrag"))
        n, f, c = get("train", "native"), get("train", "nofrag"), get("train", "nofrag-ctypes")
        if n.get("losses") and f.get("losses"):
            v["train"] = {"bit_identical": n["losses"] == f["losses"],
                          "step_ratio_vs_native": round(f["median_step_s"] / n["median_step_s"], 4),
                          "calls_per_steady_step": f.get("calls_per_steady_step")}
            if c.get("median_step_s"):
                v["train"]["step_ratio_vs_ctypes"] = round(f["median_step_s"] / c["median_step_s"], 4)
        n, f = get("pair", "native").get("ns_per_pair"), get("pair", "nofrag").get("ns_per_pair")
        if n and f:
            v["pair"] = {k: round(f[k] / n[k], 3) for k in n if k in f}
        self.results["verdicts"] = v


def table(R):
    lines = ["# nofrag as a PyTorch allocator (bench/gpu/torch_features.py)", ""]
    if R.get("dry_run"):
        lines += ["**DRY RUN: orchestration only, no torch, no GPU, no measurements.**", ""]
    ad = R.get("adapter") or {}
    lines += [f"Adapter: {ad.get('path') or ad.get('status') or 'FAILED: ' + str(ad.get('why'))}", "",
              "| case | allocator | status | key results |", "|---|---|---|---|"]
    skip = {"case", "alloc", "status", "install", "torch", "traceback", "log_tail", "losses", "step_times",
            "live_peak_by_step", "seq_lens", "calls_by_step", "nofrag_stats", "driver_calls_by_step"}
    for key, r in R.get("cells", {}).items():
        case, alloc = key.split("/")
        kv = ", ".join(f"{k}={json.dumps(v)[:80]}" for k, v in r.items() if k not in skip)
        lines.append(f"| {case} | {alloc} | {r.get('status')} | {kv[:400]} |")
    if R.get("verdicts"):
        lines += ["", "## Verdicts", "", "```", json.dumps(R["verdicts"], indent=1), "```"]
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        p = argparse.ArgumentParser()
        p.add_argument("--case", required=True, choices=sorted(CASES))
        p.add_argument("--alloc", required=True, choices=("native", "nofrag", "nofrag-ctypes"))
        p.add_argument("--json", required=True)
        p.add_argument("--out", required=True)
        return worker(p.parse_args(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--budget", type=float, default=420)
    p.add_argument("--cases", default="", help="comma-separated subset (default: all)")
    p.add_argument("--allocs", default="", help="comma-separated allocators to run (default: every one a case has)")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    Orchestrator(a).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
