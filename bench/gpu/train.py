#!/usr/bin/env python3
"""Training benchmark: PyTorch native vs expandable_segments vs nofrag.

Orchestrator (run by bench/gpu/run.sh; every configuration in its own
subprocess with a timeout, results written after each run so nothing is lost
when one configuration fails or the time budget runs out):

    python3 bench/gpu/train.py --out $OUT --budget 420 [--bisect gpt2] [--models gpt2,vit,llama]

Worker (one training run; writes one JSON file):

    python3 bench/gpu/train.py worker --model gpt2 --alloc nofrag --steps 20 [--cap BYTES] --json F

Workloads (random init, AdamW, bf16 autocast, deterministic settings; the data
come from a seeded CUDA generator per step, identical in every run):
  gpt2   GPT-2 124M (transformers GPT2LMHeadModel), batch 16, seq ~ U[64, 1024] per step
  llama  Llama-style 1.1B (hidden 2048, 16 layers, 16 heads / 4 kv heads, ffn 5632,
         vocab 32000), gradient checkpointing, batch 4, seq ~ U[256, 2048]
  vit    torchvision vit_b_16, batch 128, 224x224 (fixed shapes)

Per run: loss per step as float.hex (bit-identity against native), peak live
(max_memory_allocated; nofrag: live_rounded_peak, also live_peak), peak
reserved (PyTorch reserved_bytes.all.peak; nofrag physical_peak and
mapped_peak), median step time (synchronize around each step, warm-up steps
skipped), backend/driver calls per steady step (nofrag: stats.backend_calls;
PyTorch: num_device_alloc + num_device_free), and, with --bisect, the min
capacity by bisection (PyTorch: set_per_process_memory_fraction; nofrag: its
limit), each probe a fresh subprocess running --probe-steps steps.

NOFRAG_BENCH_TRACE=DIR records every nofrag run's allocations and frees (the
pool's `trace:` config, RMM CSV) to DIR/MODEL-ALLOC-CAP.csv, for replay on a
machine without a GPU: `nofrag replay FILE --limit L`.

--dry-run simulates workers without torch/GPU (to test this script).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import (GiB, ROOT, BudgetedRunner, base_env, bisect_caps, deterministic, dry_banner, gib,  # noqa: E402
                    long_steps)
# tight:1 / spill:host; nofrag-base: plain nofrag from another build ($NOFRAG_BASE_LIB), for a
# change's A/B in the same round (--capped-allocs nofrag,nofrag-base)
ALLOCS = ("native", "expandable", "nofrag", "nofrag-tight", "nofrag-spill", "nofrag-base", "nofrag-units",
          "nofrag-edges")
DEFAULT_ALLOCS = "native,expandable,nofrag,nofrag-tight"  # nofrag-spill on request (bench/gpu/spill.py)
MODELS = {  # batch, seq range (None: fixed shapes), default steps, run timeout s
    "gpt2": dict(batch=16, seq=(64, 1024), steps=20, timeout=150),
    "vit": dict(batch=128, seq=None, steps=20, timeout=120),
    "llama": dict(batch=4, seq=(256, 2048), steps=20, timeout=210),
}
WARMUP = 3
SEED = 1234


# ====================================================================== worker

def worker_env(alloc):
    env = base_env(alloc)
    if alloc == "nofrag-base":
        env["NOFRAG_LIB"] = os.environ["NOFRAG_BASE_LIB"]
    return env


def seq_lengths(model, steps):
    """The per-step sequence lengths: the same list in every run."""
    spec = MODELS[model]
    if spec["seq"] is None:
        return [0] * steps
    rng = random.Random(SEED)
    lo, hi = spec["seq"]
    return [rng.randint(lo, hi) for _ in range(steps)]


def build(model, torch):
    if model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        with torch.device("cuda"):
            m = GPT2LMHeadModel(GPT2Config())
        return m, 50257
    if model == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                          num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                          max_position_embeddings=2048)
        with torch.device("cuda"):
            m = LlamaForCausalLM(cfg)
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return m, 32000
    if model == "vit":
        import torchvision
        with torch.device("cuda"):
            m = torchvision.models.vit_b_16(weights=None)
        return m, 1000
    raise ValueError(model)


def run_worker(a):
    t_start = time.time()
    res = {"model": a.model, "alloc": a.alloc, "steps": a.steps, "cap": a.cap, "status": "started"}

    def dump():
        with open(a.json, "w") as f:
            json.dump(res, f)

    dump()
    if a.alloc.startswith("nofrag"):
        import nofrag.torch as nft  # before torch initialises CUDA
        conf = {"limit": str(a.cap)} if a.cap else {}
        if a.alloc == "nofrag-tight":
            conf["tight"] = "1"
        if a.alloc == "nofrag-spill":
            conf["spill"] = "host"
        if a.alloc == "nofrag-units":
            conf["units"] = "16"
        if a.alloc == "nofrag-edges":
            conf["edges"] = "1"
        if os.environ.get("NOFRAG_BENCH_TRACE"):  # a directory: record the run for `nofrag replay`
            conf["trace"] = os.path.join(os.environ["NOFRAG_BENCH_TRACE"], f"{a.model}-{a.alloc}-{a.cap}.csv")
            conf["trace_max"] = "2GiB"
        res["nofrag_install"] = nft.enable(**conf)
    import torch
    deterministic(torch, SEED)
    res["torch"] = torch.__version__
    total = torch.cuda.mem_get_info()[1]
    res["device_total"] = total
    if a.cap and not a.alloc.startswith("nofrag"):
        frac = min(1.0, a.cap / total)
        torch.cuda.set_per_process_memory_fraction(float(frac), 0)
        res["fraction"] = frac
    nf = None
    if a.alloc.startswith("nofrag"):
        import nofrag
        nf = nofrag
    model, vocab = build(a.model, torch)
    if nf is not None:
        res["nofrag_config"] = _nofrag_conf()  # the pool exists once the model is on the GPU
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=False, foreach=True)
    lens = seq_lengths(a.model, a.steps)
    batch = MODELS[a.model]["batch"]
    gen = torch.Generator(device="cuda")
    losses, times, calls, live_peaks, drv, kinds, kind_ns = [], [], [], [], [], [], []
    res["status"] = "running"
    for step in range(a.steps):
        gen.manual_seed(SEED * 1000 + step)
        if a.model == "vit":
            x = torch.randn(batch, 3, 224, 224, device="cuda", generator=gen)
            y = torch.randint(0, vocab, (batch,), device="cuda", generator=gen)
        else:
            x = torch.randint(0, vocab, (batch, lens[step]), device="cuda", generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if a.model == "vit":
                loss = torch.nn.functional.cross_entropy(model(x), y)
            else:
                loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()).hex())
        live_peaks.append(torch.cuda.max_memory_allocated())
        if nf is not None:
            st = nf.stats(0)
            calls.append(st["backend_calls"])
            kinds.append(dict(st["calls"], reclaims=st["reclaims"], spilled=st.get("spilled", 0)))
            kind_ns.append(dict(st.get("call_ns", {})))  # time in the calls (event_sync: host waits)
        else:
            ms = torch.cuda.memory_stats()
            drv.append(ms.get("num_device_alloc", 0) + ms.get("num_device_free", 0))
        del x, loss
    # Steady steps: after warm-up, steps that set no new live peak (with
    # dynamic shapes a longer sequence than ever before must grow memory;
    # every allocator pays then). Calls/step is averaged over those.
    def per_steady(cum):
        d = [cum[i] - cum[i - 1] for i in range(max(1, WARMUP), len(cum)) if live_peaks[i] <= live_peaks[i - 1]]
        return (sum(d) / len(d)) if d else None
    res.update(losses=losses, step_times=times, seq_lens=lens, live_peak_by_step=live_peaks,
               median_step_s=statistics.median(times[WARMUP:] or times))
    res["peak_live"] = torch.cuda.max_memory_allocated()
    res["peak_reserved"] = torch.cuda.max_memory_reserved()
    ms = torch.cuda.memory_stats()
    res["num_alloc_retries"] = ms.get("num_alloc_retries", 0)
    res["num_ooms"] = ms.get("num_ooms", 0)
    if nf is not None:
        s = nf.stats(0)
        res["nofrag_stats"] = {k: v for k, v in s.items()}
        res["peak_requested"] = s["live_peak"]
        res["peak_mapped"] = s["mapped_peak"]
        res["peak_physical"] = s["physical_peak"]
        res["calls_by_step"] = calls
        res["calls_per_steady_step"] = per_steady(calls)
        # Per step, the calls by kind (map, unmap, set_access, event_sync, ...):
        # what a slow step at the limit spends its calls on (host waits vs maps).
        by_step = []
        for prev, cur in zip([{}] + kinds, kinds):
            delta = {k: v - prev.get(k, 0) for k, v in cur.items()}
            by_step.append({k: v for k, v in delta.items() if v})
        res["calls_by_kind_by_step"] = by_step
        # Per step, the seconds spent in those calls by kind: the driver's
        # charge (map, set_access, ...) and the host waits (event_sync).
        ns_step = []
        for prev, cur in zip([{}] + kind_ns, kind_ns):
            delta = {k: (v - prev.get(k, 0)) * 1e-9 for k, v in cur.items()}
            ns_step.append({k: round(v, 6) for k, v in delta.items() if v})
        res["call_seconds_by_kind_by_step"] = ns_step
        res["call_seconds_by_step"] = [round(sum(d.values()), 6) for d in ns_step]
    else:
        res["peak_requested"] = ms.get("requested_bytes.all.peak", 0)
        res["driver_calls_by_step"] = drv
        res["calls_per_steady_step"] = per_steady(drv)
    res["wall_s"] = time.time() - t_start
    res["status"] = "ok"
    dump()


def _nofrag_conf():
    import ctypes
    import nofrag
    buf = ctypes.create_string_buffer(512)
    nofrag.load().nf_torch_config_string(0, buf, 512)
    return buf.value.decode()


def worker_main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--alloc", required=True, choices=ALLOCS)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cap", type=int, default=0, help="memory cap in bytes (0: none)")
    p.add_argument("--json", required=True)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    if a.dry_run:
        return dry_worker(a)
    try:
        run_worker(a)
        return 0
    except BaseException as e:  # report OOM distinctly: bisection needs it
        import traceback
        try:
            with open(a.json) as f:
                res = json.load(f)
        except Exception:
            res = {"model": a.model, "alloc": a.alloc}
        msg = f"{type(e).__name__}: {e}"
        oom = "out of memory" in msg.lower() or type(e).__name__ == "OutOfMemoryError"
        res.update(status="oom" if oom else "error", error=msg[:2000],
                   traceback=traceback.format_exc()[-4000:])
        with open(a.json, "w") as f:
            json.dump(res, f)
        print(msg[:500], file=sys.stderr)
        return 3 if oom else 1


def dry_worker(a):
    """Fake run, obviously synthetic numbers (not measurements): live 10/20/30
    GiB, native needs 1.5x live, expandable 1.25x, nofrag 1.125x; 1 s steps."""
    live = {"gpt2": 10, "vit": 20, "llama": 30}[a.model] * GiB
    need = live * {"native": 1.5, "expandable": 1.25}.get(a.alloc, 1.125)
    rsv = live * {"native": 2.0, "expandable": 1.5}.get(a.alloc, 1.25)
    ok = not a.cap or a.cap >= need or a.alloc == "nofrag-spill"
    res = {"model": a.model, "alloc": a.alloc, "steps": a.steps, "cap": a.cap, "status": "ok" if ok else "oom",
           "dry_run": True, "losses": [(1.0 + i).hex() for i in range(a.steps)], "median_step_s": 1.0,
           "peak_live": int(live), "peak_reserved": int(min(rsv, a.cap or rsv)),
           "peak_requested": int(live), "calls_per_steady_step": 0.0,
           "live_peak_by_step": [int(live)] * a.steps}
    if a.alloc.startswith("nofrag"):
        res.update(peak_physical=int(rsv), peak_mapped=int(rsv))
    with open(a.json, "w") as f:
        json.dump(res, f)
    return 0 if ok else 3


# ================================================================ orchestrator

class Runner(BudgetedRunner):
    def __init__(self, a):
        self.a = a
        super().__init__(a.out, a.budget, {"runs": [], "bisect": {}, "limits": None, "dry_run": a.dry_run,
                                           "started": time.strftime("%F %T"), "budget_s": a.budget}, markdown)

    def run(self, model, alloc, steps, cap=0, timeout=None):
        """One worker subprocess; returns its result dict (status set even on crash)."""
        timeout = self.timeout_for(timeout or MODELS[model]["timeout"], 20)
        tag = f"{model}-{alloc}" + (f"-cap{cap}" if cap else "")
        if timeout is None:
            return {"model": model, "alloc": alloc, "cap": cap, "status": "skipped (time budget)"}
        self.n += 1
        jpath = os.path.join(self.a.out, "runs", f"{self.n:02d}-{tag}.json")
        os.makedirs(os.path.dirname(jpath), exist_ok=True)
        cmd = [sys.executable, os.path.abspath(__file__), "worker", "--model", model, "--alloc", alloc,
               "--steps", str(steps), "--cap", str(int(cap)), "--json", jpath]
        if self.a.dry_run:
            cmd.append("--dry-run")
        t0 = time.time()
        rc = self.launch(cmd, worker_env(alloc), jpath[:-5] + ".log", timeout)
        res = self.settle(self.load_json(jpath, {"model": model, "alloc": alloc, "cap": cap}), rc, timeout,
                          jpath[:-5] + ".log", ("started", "running", None), 1500)
        res["rc"] = rc
        res["elapsed_s"] = round(time.time() - t0, 1)
        self.report(tag, res)
        return res

    def capped(self, models):
        """nofrag at caps of --caps x live (live: the peak of its own uncapped
        run), full length: step time paired with the native run of the same
        session, calls per steady step (views: 0 once a step repeats)."""
        for model in models:
            base = next((r for r in self.results["runs"] if r.get("model") == model and r.get("alloc") == "nofrag"
                         and not r.get("cap") and r.get("status") == "ok"), None)
            for f in [float(x) for x in self.a.caps.split(",") if x]:
                for alloc in self.a.capped_allocs.split(","):  # each at the same cap (sized by plain nofrag)
                    if not base:
                        self.results["runs"].append({"model": model, "alloc": alloc, "cap_factor": f,
                                                     "status": "no uncapped nofrag run to size the cap"})
                        continue
                    r = self.run(model, alloc, self.a.steps or MODELS[model]["steps"], cap=int(base["peak_live"] * f))
                    r["cap_factor"] = f
                    self.results["runs"].append(r)
                    self.save()

    def bisect(self, model):
        """Min capacity per allocator. Bounds from the uncapped runs: below the
        live peak of the first --probe-steps steps is infeasible; the run's own
        peak reserved (+2 granules) is assumed feasible. Each probe is a fresh
        process; stops after --probes probes or on the time budget."""
        k = self.a.probe_steps
        out = {}
        for alloc in self.a.bisect_allocs.split(","):
            base = next((r for r in self.results["runs"] if r.get("model") == model and r.get("alloc") == alloc
                         and r.get("status") == "ok"), None)
            if not base:
                out[alloc] = {"status": "no uncapped run to start from"}
                continue
            live = base["live_peak_by_step"][min(k, len(base["live_peak_by_step"])) - 1]
            hi = (base.get("peak_physical") or base["peak_reserved"]) + (4 << 20)
            probes = []

            def probe(cap):
                r = self.run(model, alloc, k, cap=cap, timeout=MODELS[model]["timeout"])
                st = r.get("status", "")
                if st.startswith("skipped"):
                    return "skip"
                probes.append({"cap": cap, "status": st, "median_step_s": r.get("median_step_s"),
                               "calls_per_steady_step": r.get("calls_per_steady_step"),
                               "loss_hex": r.get("losses"), "error": r.get("error", "")[:300]})
                return "ok" if st == "ok" else "oom"  # any failure counts as infeasible here

            # The first probe sits at the target (--first-probe x live): one
            # probe then proves or refutes it; bisection goes on from there.
            first = int(live * self.a.first_probe) if self.a.first_probe else 0
            for _cap, _v, lo, hi in bisect_caps(live, hi, max(self.a.tol * live, 4 << 20), self.a.probes, probe,
                                                first):
                out[alloc] = {"live": live, "min_cap": hi, "infeasible_below": lo,
                              "min_cap_over_live": hi / live, "probes": probes, "probe_steps": k}
                self.results["bisect"][model] = out
                self.save()
            if alloc not in out:
                out[alloc] = {"live": live, "min_cap": hi, "min_cap_over_live": hi / live, "probes": probes,
                              "probe_steps": k, "note": "no probe run (interval within tolerance or no time)"}
        self.results["bisect"][model] = out
        self.save()

    def limits(self):
        t = min(150, self.left() - 5)
        if t < 30:
            self.results["limits"] = {"status": "skipped (time budget)"}
            return
        jpath = os.path.join(self.a.out, "limits.json")
        cmd = [sys.executable, os.path.join(HERE, "limits.py"), "--json", jpath]
        if self.a.dry_run:
            cmd.append("--dry-run")
        with open(os.path.join(self.a.out, "limits.log"), "w") as log:
            try:
                subprocess.run(cmd, env=worker_env("nofrag"), stdout=log, stderr=subprocess.STDOUT, timeout=t,
                               cwd=ROOT)
            except subprocess.TimeoutExpired:
                pass
        try:
            with open(jpath) as f:
                self.results["limits"] = json.load(f)
        except Exception as e:
            self.results["limits"] = {"status": f"no result ({e})"}
        self.save()


# ================================================================ report

def markdown(R):
    runs = R["runs"]
    native = {r.get("model"): r for r in runs if r.get("alloc") == "native" and r.get("status") == "ok"}
    lines = ["# GPU training benchmark (bench/gpu/train.py)" + (" -- DRY RUN" if R.get("dry_run") else ""), "",
             *dry_banner(R),
             f"Started {R.get('started')}; budget {R.get('budget_s')} s. Peak reserved for nofrag = physical "
             "(granules created); mapped in its own column. Calls/step = backend calls per steady step "
             "(nofrag) or num_device_alloc+num_device_free (PyTorch). Paired = median over steps after warm-up of "
             "(this run's step i / native's step i): the same sequence lengths, so with dynamic shapes it compares "
             "like with like, where the ratio of medians can pick different steps. Long steps = summed time of the "
             "steps after warm-up whose sequence is >= 0.7 x the longest, against native's same steps (dynamic "
             "shapes only): short steps are CPU-bound and move by +-20% between runs for every allocator alike, "
             "so the long ones are where an allocator's cost shows (bench/gpu/paired.py).", "",
             "| workload | allocator | status | peak live GiB | peak reserved GiB | mapped GiB | reserved/live "
             "| min cap/live | median step s | vs native | paired vs native | long steps vs native | calls/step "
             "| loss = native |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        m, al = r.get("model"), r.get("alloc")
        if r.get("cap_factor"):
            al = f"{al} cap {r['cap_factor']}x live"
        live = r.get("peak_live") or 0
        rsv = r.get("peak_physical") or r.get("peak_reserved") or 0
        nat = native.get(m)
        speed = ""
        if nat and r.get("median_step_s") and nat.get("median_step_s"):
            speed = f"{r['median_step_s'] / nat['median_step_s']:.3f}"
        paired = ""
        if nat and r.get("step_times") and nat.get("step_times") and al != "native":
            pr = [b / a for a, b in zip(nat["step_times"][WARMUP:], r["step_times"][WARMUP:]) if a > 0]
            paired = f"{statistics.median(pr):.3f}" if pr else ""
        long_ = ""
        if paired:
            idx = long_steps(nat.get("seq_lens"), WARMUP, min(len(r["step_times"]), len(nat["step_times"])))
            if idx:
                long_ = f"{sum(r['step_times'][i] for i in idx) / sum(nat['step_times'][i] for i in idx):.3f}"
        same = ""
        if nat and r.get("losses") and al != "native":
            a, b = r["losses"], nat["losses"]
            diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            same = "yes" if diff is None and len(a) == len(b) else f"no (step {diff})"
        mc = {} if r.get("cap_factor") else R.get("bisect", {}).get(m, {}).get(al, {})
        mcs = f"{mc['min_cap_over_live']:.4f}" if mc.get("min_cap_over_live") else ""
        cps = r.get("calls_per_steady_step")
        ratio = f"{rsv / live:.4f}" if live else ""
        step = f"{r['median_step_s']:.4f}" if r.get("median_step_s") else ""
        lines.append(f"| {m} | {al} | {r.get('status')} | {gib(live)} | {gib(rsv)} | {gib(r.get('peak_mapped'))} | "
                     f"{ratio} | {mcs} | {step} | {speed} | {paired} | {long_} | {'' if cps is None else f'{cps:.2f}'} "
                     f"| {same} |")
    for model, per in (R.get("bisect") or {}).items():
        lines += ["", f"## Min capacity bisection: {model}", "",
                  "| allocator | live (first k steps) GiB | min feasible cap GiB | infeasible at GiB | cap/live "
                  "| probes | step s at min cap | vs native | calls/step at min cap | loss = native |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        nat = native.get(model)
        for al, b in per.items():
            pr = b.get("probes", [])
            p = next((p for p in pr if p["cap"] == b.get("min_cap") and p["status"] == "ok"), {})
            at, cps = p.get("median_step_s"), p.get("calls_per_steady_step")
            vs = f"{at / nat['median_step_s']:.3f}" if at and nat and nat.get("median_step_s") else ""
            same = ""
            if nat and p.get("loss_hex"):
                k = len(p["loss_hex"])
                same = "yes" if p["loss_hex"] == nat["losses"][:k] else "no"
            lines.append(f"| {al} | {gib(b.get('live'))} | {gib(b.get('min_cap'))} | {gib(b.get('infeasible_below'))} "
                         f"| {b.get('min_cap_over_live', 0):.4f} | {len(pr)} | {at or ''} | {vs} "
                         f"| {'' if cps is None else f'{cps:.2f}'} | {same} |"
                         if "live" in b else f"| {al} | {b.get('status')} | | | | | | | | |")
    lim = R.get("limits")
    if lim:
        lines += ["", "## PyTorch features under the nofrag plug-in (bench/gpu/limits.py)", "",
                  "| check | outcome | detail |", "| --- | --- | --- |"]
        for k, v in (lim.get("checks") or {}).items():
            det = str(v.get("detail", "")).replace("|", "/").replace("\n", " ")[:300]
            lines.append(f"| {k} | {v.get('outcome')} | {det} |")
        if lim.get("status"):
            lines.append(f"\nlimits status: {lim['status']}")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--budget", type=float, default=420, help="seconds for everything this script runs")
    p.add_argument("--models", default="gpt2,vit,llama")
    p.add_argument("--steps", type=int, default=0, help="steps per run (0: per-model default, 20)")
    p.add_argument("--bisect", default="gpt2", help="models to bisect ('' for none)")
    p.add_argument("--allocs", default=DEFAULT_ALLOCS, help="allocators for the uncapped runs (also: nofrag-spill)")
    p.add_argument("--bisect-allocs", default="native,expandable,nofrag", help="allocators to bisect")
    p.add_argument("--probes", type=int, default=6, help="max probes per allocator")
    p.add_argument("--probe-steps", type=int, default=10)
    p.add_argument("--first-probe", type=float, default=1.003,
                   help="first cap probed, as a multiple of live (0: plain bisection)")
    p.add_argument("--tol", type=float, default=0.002, help="bisection tolerance, fraction of live")
    p.add_argument("--no-limits", action="store_true")
    p.add_argument("--capped-allocs", default="nofrag",
                   help="nofrag variants run at each --caps factor (e.g. nofrag,nofrag-tight)")
    p.add_argument("--caps", default="", help="nofrag also runs capped at these multiples of its uncapped live "
                   "peak, full length (e.g. 1.01), after the uncapped runs")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    if "nofrag-base" in (a.allocs + "," + a.capped_allocs).split(",") and not os.environ.get("NOFRAG_BASE_LIB"):
        p.error("nofrag-base needs NOFRAG_BASE_LIB (the other build's libnofrag.so)")
    R = Runner(a)
    models = [m for m in a.models.split(",") if m]
    # The GPT-2 uncapped runs first (the bisection needs them), then the
    # feature checks (short), then the other models, then the bisection with
    # whatever time is left.
    first = [m for m in models if m in a.bisect.split(",")]
    steps_of = lambda m: a.steps or MODELS[m]["steps"]  # noqa: E731
    R.uncapped(first, a.allocs.split(","), steps_of, R.run)
    if not a.no_limits:
        R.limits()
    R.uncapped([m for m in models if m not in first], a.allocs.split(","), steps_of, R.run)
    R.capped(models)
    for m in first:
        R.bisect(m)
    R.results["finished"] = time.strftime("%F %T")
    R.save()
    print(markdown(R.results))


if __name__ == "__main__":
    main()
