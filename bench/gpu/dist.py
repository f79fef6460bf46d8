#!/usr/bin/env python3
"""Multi-GPU training benchmark (torchrun): PyTorch native vs expandable_segments vs nofrag.

Orchestrator (run by bench/gpu/run_dist.sh; one torchrun launch per (workload,
allocator[, cap]), each with a timeout and killed as a whole process group on
expiry; results written after every launch so nothing is lost):

    python3 bench/gpu/dist.py --out $OUT --budget 480 --nproc-per-node 2 [--models gpt2,llama] [--bisect gpt2]

Worker (what torchrun starts on every rank; writes <rundir>/rank<R>.json):

    torchrun --standalone --nproc_per_node 2 bench/gpu/dist.py worker --model gpt2 --alloc nofrag \
        --steps 20 [--cap BYTES] --rundir DIR

Workloads (random init, AdamW, deterministic settings as bench/gpu/train.py;
sequence lengths per step from random.Random(SEED), the same list on every
rank and in every launch; the tokens from a seeded CUDA generator per step and
rank, so rank r sees the same data under every allocator):
  llama  Llama-style 1.1B (transformers LlamaConfig hidden 2048, 16 layers, 16 heads / 4 kv heads,
         ffn 5632, vocab 32000), FSDP2: fully_shard per decoder layer then the root,
         MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), gradient checkpointing
         (non-reentrant), batch 4 per rank, seq ~ U[256, 2048]
  gpt2   GPT-2 124M (GPT2LMHeadModel), DistributedDataParallel, bf16 autocast, batch 16 per rank,
         seq ~ U[64, 1024]

nofrag is enabled in every rank before CUDA is initialised (nofrag.torch.enable
is the first thing the worker does; torch.cuda.set_device(LOCAL_RANK) after).

Per rank: loss per step (float.hex; compared with native's same rank), peak
live (torch.cuda.max_memory_allocated; under nofrag the plug-in's patched
version = nofrag live_rounded_peak), peak reserved (max_memory_reserved;
nofrag: physical_peak), median step time (synchronize around each step,
warm-up skipped), and NCCL correctness on the allocator's memory, before the
model is built (fresh pool) and after training (re-used memory): all_reduce
of a float32 tensor filled with rank+1 (== n(n+1)/2 everywhere), all_reduce of
an int64 index pattern, all_gather_into_tensor of per-rank index ranges (==
arange), reduce_scatter_tensor. With --bisect, min capacity per allocator (the
same cap on every rank; PyTorch: set_per_process_memory_fraction; nofrag:
enable(limit=cap)), a launch counting as feasible when every rank finishes.

Environment of every launch: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1 (no multicast objects), CUBLAS_WORKSPACE_CONFIG=:4096:8.

--dry-run replaces torchrun by a small launcher (same env variables: RANK,
LOCAL_RANK, WORLD_SIZE, ...) and the worker by a fake without torch/GPU, to
test the orchestration: launching, per-rank JSON collection, bisection, tables.
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
from common import GiB, BudgetedRunner, base_env, bisect_caps, deterministic, dry_banner, gib  # noqa: E402
ALLOCS = ("native", "expandable", "nofrag")
MODELS = {  # batch per rank, seq range, default steps, launch timeout s
    "gpt2": dict(batch=16, seq=(64, 1024), steps=20, timeout=150, wrap="ddp"),
    "llama": dict(batch=4, seq=(256, 2048), steps=16, timeout=240, wrap="fsdp2"),
}
WARMUP = 3
SEED = 1234
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CHECK_ELEMS = 4 << 20  # elements per rank in the NCCL checks (16 MiB fp32 / 32 MiB int64)


def launch_env(alloc):
    env = base_env(alloc)
    env.update(NO_MULTICAST)
    env.setdefault("OMP_NUM_THREADS", "4")
    env.setdefault("NCCL_DEBUG", "WARN")
    return env


def seq_lengths(model, steps):
    """Per-step sequence lengths: the same list on every rank and in every launch."""
    rng = random.Random(SEED)
    lo, hi = MODELS[model]["seq"]
    return [rng.randint(lo, hi) for _ in range(steps)]


def rank_info():
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")),
            int(os.environ.get("WORLD_SIZE", "1")))


# ====================================================================== worker

class Out:
    """The rank's JSON, rewritten at every stage (a crash leaves the last stage)."""

    def __init__(self, path, res):
        self.path, self.res = path, res
        self.dump()

    def dump(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.res, f)
        os.replace(tmp, self.path)


def nccl_checks(torch, dist, dev, n, rank, nf=None, local=0):
    """Collectives on tensors from the current allocator, results checked exactly."""
    out = {}
    m = CHECK_ELEMS
    live0 = nf.stats(local)["live"] if nf else None
    # 1. all_reduce: every rank fills rank+1; the sum is n(n+1)/2 everywhere (exact in fp32).
    t = torch.full((m,), float(rank + 1), dtype=torch.float32, device=dev)
    if nf:
        out["nofrag_live_delta_bytes"] = nf.stats(local)["live"] - live0  # the buffer is nofrag memory
    dist.all_reduce(t)
    exp = n * (n + 1) / 2
    out["all_reduce_fill"] = bool(torch.equal(t, torch.full_like(t, exp)))
    # 2. all_reduce of an index pattern on a view at an odd element offset (not the block start).
    base = torch.arange(m + 1, dtype=torch.int64, device=dev)
    v = base[1:]
    v.add_(rank)
    dist.all_reduce(v)
    ref = torch.arange(1, m + 1, dtype=torch.int64, device=dev) * n + n * (n - 1) // 2
    out["all_reduce_pattern_offset_view"] = bool(torch.equal(v, ref)) and int(base[0].item()) == 0
    # 3. all_gather_into_tensor: rank r contributes arange(r*m, (r+1)*m); the result is arange(n*m).
    src = torch.arange(rank * m, (rank + 1) * m, dtype=torch.int64, device=dev)
    dst = torch.empty(n * m, dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(dst, src)
    out["all_gather"] = bool(torch.equal(dst, torch.arange(n * m, dtype=torch.int64, device=dev)))
    # 4. reduce_scatter_tensor: input chunk j on rank r = (r+1)*(j+1); output on rank r = n(n+1)/2*(r+1).
    inp = (torch.arange(n, dtype=torch.float32, device=dev) + 1).repeat_interleave(m) * (rank + 1)
    rs = torch.empty(m, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(rs, inp)
    out["reduce_scatter"] = bool(torch.equal(rs, torch.full_like(rs, exp * (rank + 1))))
    torch.cuda.synchronize(dev)
    # Every rank must agree that every rank passed.
    ok = torch.tensor([1 if all(v for k, v in out.items() if isinstance(v, bool)) else 0],
                      dtype=torch.int32, device=dev)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    out["all_ranks_ok"] = bool(ok.item() == 1)
    out["ok"] = all(v for k, v in out.items() if isinstance(v, bool))
    del t, base, v, ref, src, dst, inp, rs, ok
    return out


def run_worker(a, rec):
    res = rec.res
    rank, local, world = rank_info()
    nf = None
    if a.alloc == "nofrag":
        # First thing: before anything touches torch.cuda (enable imports torch itself).
        import nofrag.torch as nft
        import torch
        res["cuda_initialised_before_enable"] = bool(torch.cuda.is_initialized())
        res["nofrag_install"] = nft.enable(**({"limit": str(a.cap)} if a.cap else {}))
        import nofrag
        nf = nofrag
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    deterministic(torch, SEED)
    res["torch"] = torch.__version__
    res["env"] = {k: os.environ.get(k) for k in list(NO_MULTICAST) + ["CUBLAS_WORKSPACE_CONFIG",
                                                                       "PYTORCH_CUDA_ALLOC_CONF"]}
    total = torch.cuda.mem_get_info(dev)[1]
    res["device_total"] = total
    res["device_name"] = torch.cuda.get_device_name(dev)
    if a.cap and a.alloc != "nofrag":
        frac = min(1.0, a.cap / total)
        torch.cuda.set_per_process_memory_fraction(float(frac), local)
        res["fraction"] = frac
    from datetime import timedelta
    try:
        dist.init_process_group("nccl", device_id=dev, timeout=timedelta(seconds=a.nccl_timeout))
    except TypeError:  # PyTorch without device_id
        dist.init_process_group("nccl", timeout=timedelta(seconds=a.nccl_timeout))
    n = dist.get_world_size()
    res.update(world_size=n, status="nccl check (fresh)")
    rec.dump()
    res["nccl_check_pre"] = nccl_checks(torch, dist, dev, n, rank, nf, local)
    rec.dump()

    spec = MODELS[a.model]
    res["status"] = "building"
    if a.model == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:  # PyTorch < 2.6
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        cfg = LlamaConfig(hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                          num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                          max_position_embeddings=2048, use_cache=False)
        # Same seed on every rank: identical full weights, then each rank keeps its shard.
        with torch.device(dev):
            model = LlamaForCausalLM(cfg)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        vocab, autocast = 32000, False
    else:
        from transformers import GPT2Config, GPT2LMHeadModel
        from torch.nn.parallel import DistributedDataParallel as DDP
        with torch.device(dev):
            model = GPT2LMHeadModel(GPT2Config())
        model = DDP(model, device_ids=[local], output_device=local)
        vocab, autocast = 50257, True
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=False, foreach=True)
    # Drop what building left cached (full llama weights before sharding) so that
    # the peaks measure training, alike for every allocator.
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    res["after_build"] = {"live": torch.cuda.memory_allocated(dev), "reserved": torch.cuda.memory_reserved(dev)}
    lens = seq_lengths(a.model, a.steps)
    gen = torch.Generator(device=dev)
    losses, times, live_peaks, rsv_peaks = [], [], [], []
    res["status"] = "running"
    rec.dump()
    for step in range(a.steps):
        gen.manual_seed(SEED * 1000 + step + 100003 * rank)
        x = torch.randint(0, vocab, (spec["batch"], lens[step]), device=dev, generator=gen)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        if autocast:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss
        else:
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()).hex())
        live_peaks.append(torch.cuda.max_memory_allocated(dev))
        rsv_peaks.append(torch.cuda.max_memory_reserved(dev))
        del x, loss
    res.update(losses=losses, step_times=times, seq_lens=lens, live_peak_by_step=live_peaks,
               reserved_peak_by_step=rsv_peaks, median_step_s=statistics.median(times[WARMUP:] or times),
               peak_live=torch.cuda.max_memory_allocated(dev), peak_reserved=torch.cuda.max_memory_reserved(dev))
    ms = torch.cuda.memory_stats(dev)
    res["num_alloc_retries"] = ms.get("num_alloc_retries", 0)
    res["num_ooms"] = ms.get("num_ooms", 0)
    if nf is not None:
        s = nf.stats(local)
        res["nofrag_stats"] = dict(s)
        res.update(peak_requested=s["live_peak"], peak_mapped=s["mapped_peak"], peak_physical=s["physical_peak"])
    else:
        res["peak_requested"] = ms.get("requested_bytes.all.peak", 0)
    res["status"] = "nccl check (after training)"
    rec.dump()
    del opt
    res["nccl_check_post"] = nccl_checks(torch, dist, dev, n, rank, nf, local)
    res["nccl_ok"] = bool(res["nccl_check_pre"]["ok"] and res["nccl_check_post"]["ok"])
    dist.barrier()
    res["status"] = "ok"
    rec.dump()
    dist.destroy_process_group()


def worker_main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--alloc", required=True, choices=ALLOCS)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cap", type=int, default=0, help="memory cap per rank in bytes (0: none)")
    p.add_argument("--rundir", required=True)
    p.add_argument("--nccl-timeout", type=int, default=180)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    rank, local, world = rank_info()
    rec = Out(os.path.join(a.rundir, f"rank{rank}.json"),
              {"model": a.model, "alloc": a.alloc, "steps": a.steps, "cap": a.cap, "rank": rank,
               "local_rank": local, "world_size": world, "status": "started", "t_start": time.time()})
    if a.dry_run:
        return dry_worker(a, rec)
    try:
        run_worker(a, rec)
        rec.res["wall_s"] = time.time() - rec.res["t_start"]
        rec.dump()
        return 0
    except BaseException as e:  # report OOM distinctly: bisection needs it
        import traceback
        msg = f"{type(e).__name__}: {e}"
        oom = "out of memory" in msg.lower() or type(e).__name__ == "OutOfMemoryError"
        rec.res.update(failed_in=rec.res.get("status"), status="oom" if oom else "error", error=msg[:2000],
                       traceback=traceback.format_exc()[-4000:], wall_s=time.time() - rec.res["t_start"])
        rec.dump()
        print(f"rank {rank}: {msg[:500]}", file=sys.stderr, flush=True)
        # Peers may be blocked in a collective: leave at once (torchrun then ends them),
        # without running NCCL / interpreter teardown that could hang.
        os._exit(3 if oom else 1)


def dry_worker(a, rec):
    """Fake rank, obviously synthetic numbers (not measurements): live 10/20 GiB
    (rank r 1/8 r more), native needs 1.5x live, expandable 1.25x, nofrag 1.125x; 1 s steps."""
    rank, local, world = rank_info()
    live = {"gpt2": 10, "llama": 20}[a.model] * GiB * (1 + rank / 8)
    need = live * {"native": 1.5, "expandable": 1.25}.get(a.alloc, 1.125)
    rsv = live * {"native": 2.0, "expandable": 1.5}.get(a.alloc, 1.25)
    time.sleep(0.05)
    res = rec.res
    res["dry_run"] = True
    # Test hooks for the orchestration: NOFRAG_DIST_DRY_HANG=<model>-<alloc> makes the last rank hang
    # (exercises the launch timeout and process-group kill), NOFRAG_DIST_DRY_ERROR=... makes it fail.
    tag = f"{a.model}-{a.alloc}"
    if rank == world - 1 and os.environ.get("NOFRAG_DIST_DRY_HANG") == tag and not a.cap:
        res["status"] = "running"
        rec.dump()
        time.sleep(3600)
    if rank == world - 1 and os.environ.get("NOFRAG_DIST_DRY_ERROR") == tag and not a.cap:
        res.update(status="error", failed_in="running", error="RuntimeError: NCCL error (dry run)")
        rec.dump()
        return 1
    if a.cap and a.cap < need:
        res.update(status="oom", failed_in="running", error="OutOfMemoryError: CUDA out of memory (dry run)")
        rec.dump()
        return 3
    chk = {"all_reduce_fill": True, "all_reduce_pattern_offset_view": True, "all_gather": True,
           "reduce_scatter": True, "all_ranks_ok": True, "ok": True}
    res.update(status="ok", world_size=world, losses=[(1.0 + i + rank / 8).hex() for i in range(a.steps)],
               median_step_s=1.0, peak_live=int(live),
               peak_reserved=int(min(rsv, a.cap or rsv)), peak_requested=int(live),
               live_peak_by_step=[int(live)] * a.steps, seq_lens=seq_lengths(a.model, a.steps),
               nccl_check_pre=chk, nccl_check_post=chk, nccl_ok=True,
               env={k: os.environ.get(k) for k in NO_MULTICAST})
    if a.alloc == "nofrag":
        res.update(peak_physical=int(rsv), peak_mapped=int(rsv))
    rec.dump()
    return 0


def fake_launch_main(argv):
    """Stand-in for torchrun in --dry-run: start N ranks with torchrun's env, wait, fail if any fails."""
    n = int(argv[0])
    rest = argv[1:]
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + rest, env=env))
    rcs = [p.wait() for p in procs]
    print(f"fake launcher: rank exit codes {rcs}", flush=True)
    return next((rc for rc in rcs if rc), 0)


# ================================================================ orchestrator

class Runner(BudgetedRunner):
    def __init__(self, a):
        self.a = a
        super().__init__(a.out, a.budget, {"runs": [], "bisect": {}, "started": time.strftime("%F %T"),
                                           "budget_s": a.budget, "nproc_per_node": a.nproc_per_node,
                                           "dry_run": a.dry_run, "env": NO_MULTICAST}, markdown)

    def launch_cmd(self, worker_args):
        me = os.path.abspath(__file__)
        if self.a.dry_run:
            return [sys.executable, me, "fake-launch", str(self.a.nproc_per_node), "worker"] + worker_args
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", str(self.a.nproc_per_node), "--max_restarts", "0",
                me, "worker"] + worker_args

    def run(self, model, alloc, steps, cap=0, timeout=None):
        """One torchrun launch; returns {"model", "alloc", "cap", "status", "ranks": [per-rank dicts]}."""
        timeout = self.timeout_for(timeout or MODELS[model]["timeout"], 25)
        tag = f"{model}-{alloc}" + (f"-cap{cap}" if cap else "")
        launch = {"model": model, "alloc": alloc, "cap": cap, "steps": steps, "ranks": []}
        if timeout is None:
            launch["status"] = "skipped (time budget)"
            return launch
        self.n += 1
        rundir = os.path.join(self.a.out, "runs", f"{self.n:02d}-{tag}")
        os.makedirs(rundir, exist_ok=True)
        wargs = ["--model", model, "--alloc", alloc, "--steps", str(steps), "--cap", str(int(cap)),
                 "--rundir", rundir, "--nccl-timeout", str(int(max(60, timeout - 10)))]
        if self.a.dry_run:
            wargs.append("--dry-run")
        cmd = self.launch_cmd(wargs)
        launch["cmd"] = " ".join(cmd)
        t0 = time.time()
        logpath = os.path.join(rundir, "launch.log")
        # Own process group: on timeout the launcher and every rank go together.
        rc = self.launch(cmd, launch_env(alloc), logpath, timeout)
        ranks = []
        for r in range(self.a.nproc_per_node):
            d = self.load_json(os.path.join(rundir, f"rank{r}.json"), {"rank": r, "status": "no result"})
            st = d.get("status", "")
            if st not in ("ok", "oom", "error") and not st.startswith("no result"):
                # Still mid-way: killed by torchrun after a peer failed, or by the timeout.
                d["failed_in"] = st
                d["status"] = "timeout" if rc == "timeout" else "killed (peer failed)"
            ranks.append(d)
        launch["ranks"] = ranks
        sts = [d["status"] for d in ranks]
        if all(s == "ok" for s in sts) and rc == 0:
            launch["status"] = "ok"
        elif "oom" in sts:
            launch["status"] = "oom"
        elif rc == "timeout":
            launch["status"] = f"timeout ({timeout:.0f}s)"
        else:
            launch["status"] = f"failed (rc {rc}; ranks: {', '.join(sorted(set(sts)))})"
        self.keep_log_tail(launch, logpath, 2000)
        launch["rc"] = rc
        launch["elapsed_s"] = round(time.time() - t0, 1)
        self.report(f"{tag} x{self.a.nproc_per_node}", launch)
        return launch

    def bisect(self, model):
        """Min capacity per allocator, one cap for every rank. Bounds from the
        uncapped launch: below the largest per-rank live peak of the first
        --probe-steps steps is infeasible; the largest per-rank peak reserved
        (+4 MiB) is assumed feasible. Stops after --probes probes or on the budget."""
        k = self.a.probe_steps
        out = self.results["bisect"].setdefault(model, {})
        for alloc in self.a.bisect_allocs.split(","):
            base = next((r for r in self.results["runs"] if r.get("model") == model and r.get("alloc") == alloc
                         and r.get("status") == "ok"), None)
            if not base:
                out[alloc] = {"status": "no uncapped run to start from"}
                continue
            live = max(d["live_peak_by_step"][min(k, len(d["live_peak_by_step"])) - 1] for d in base["ranks"])
            hi = max((d.get("peak_physical") or d["peak_reserved"]) for d in base["ranks"]) + (4 << 20)
            probes = []
            out[alloc] = {"live": live, "min_cap": hi, "infeasible_below": None, "min_cap_over_live": hi / live,
                          "probes": probes, "probe_steps": k, "note": "upper bound = uncapped peak reserved"}

            def probe(cap):
                r = self.run(model, alloc, k, cap=cap)
                st = r.get("status", "")
                if st.startswith("skipped"):
                    return "skip"
                probes.append({"cap": cap, "status": st,
                               "rank_status": [d.get("status") for d in r.get("ranks", [])],
                               "median_step_s": [d.get("median_step_s") for d in r.get("ranks", [])],
                               "error": next((d.get("error", "")[:300] for d in r.get("ranks", [])
                                              if d.get("error")), "")})
                return st if st in ("ok", "oom") else "stop"

            for cap, v, lo, hi in bisect_caps(live, hi, max(self.a.tol * live, 4 << 20), self.a.probes, probe):
                if v == "stop":  # neither feasible nor a clean OOM (timeout, crash): keep the bounds
                    out[alloc]["note"] = f"stopped: probe at {cap} ended '{probes[-1]['status']}'"
                    break
                out[alloc].update(min_cap=hi, infeasible_below=lo if lo != live else None,
                                  min_cap_over_live=hi / live, note="")
                self.save()
        self.save()


# ================================================================ report

def markdown(R):
    runs = R["runs"]
    native = {r.get("model"): r for r in runs if r.get("alloc") == "native" and r.get("status") == "ok"}
    lines = [f"# Multi-GPU training benchmark (bench/gpu/dist.py, torchrun x{R.get('nproc_per_node')})"
             + (" -- DRY RUN" if R.get("dry_run") else ""), "", *dry_banner(R),
             f"Started {R.get('started')}; budget {R.get('budget_s')} s; env "
             + ", ".join(f"{k}={v}" for k, v in R.get("env", {}).items())
             + ". One row per rank. Peak reserved for nofrag = physical (granules created). "
             "Loss = native compares every step's loss (float.hex) with native's same rank. NCCL = all_reduce "
             "(fill and offset-view pattern), all_gather_into_tensor, reduce_scatter_tensor checked exactly, "
             "before the model (fresh memory) and after training (re-used memory).", "",
             "| workload | allocator | launch | rank | rank status | peak live GiB | peak reserved GiB "
             "| reserved/live | min cap/live | median step s | vs native | loss = native | NCCL ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        m, al = r.get("model"), r.get("alloc")
        nat = native.get(m)
        mc = R.get("bisect", {}).get(m, {}).get(al, {})
        mcs = f"{mc['min_cap_over_live']:.4f}" if mc.get("min_cap_over_live") else ""
        if mcs and not any(p.get("status") == "ok" for p in mc.get("probes", [])):
            mcs = "<= " + mcs  # no feasible probe: only the uncapped peak reserved bounds it
        ranks = r.get("ranks") or [{}]
        for d in ranks:
            rk = d.get("rank", "")
            nd = next((x for x in (nat or {}).get("ranks", []) if x.get("rank") == rk), None)
            live = d.get("peak_live") or 0
            rsv = d.get("peak_physical") or d.get("peak_reserved") or 0
            speed = ""
            if nd and d.get("median_step_s") and nd.get("median_step_s"):
                speed = f"{d['median_step_s'] / nd['median_step_s']:.3f}"
            same = ""
            if nd and d.get("losses") and nd.get("losses"):
                if al == "native":
                    same = "(reference)"
                else:
                    a, b = d["losses"], nd["losses"]
                    diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                    same = "yes" if diff is None and len(a) == len(b) else f"no (step {diff})"
            nccl = ""
            if "nccl_ok" in d:
                nccl = "yes" if d["nccl_ok"] else "NO"
            elif "nccl_check_pre" in d:
                nccl = "pre only: " + ("yes" if d["nccl_check_pre"].get("ok") else "NO")
            ratio = f"{rsv / live:.4f}" if live else ""
            step = f"{d['median_step_s']:.4f}" if d.get("median_step_s") else ""
            lines.append(f"| {m} | {al} | {r.get('status')} | {rk} | {d.get('status', '')} | {gib(live)} | "
                         f"{gib(rsv)} | {ratio} | {mcs} | {step} | {speed} | {same} | {nccl} |")
    for model, per in (R.get("bisect") or {}).items():
        lines += ["", f"## Min capacity bisection: {model} (same cap on every rank)", "",
                  "| allocator | live (max over ranks, first k steps) GiB | min feasible cap GiB | infeasible at GiB "
                  "| cap/live | probes | note |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for al, b in per.items():
            if "live" not in b:
                lines.append(f"| {al} | {b.get('status')} | | | | | |")
                continue
            lines.append(f"| {al} | {gib(b['live'])} | {gib(b['min_cap'])} | {gib(b.get('infeasible_below'))} "
                         f"| {b['min_cap_over_live']:.4f} | {len(b.get('probes', []))} | {b.get('note', '')} |")
    failed = [r for r in runs if r.get("status") != "ok" and r.get("log_tail")]
    for r in failed:
        lines += ["", f"### {r['model']} / {r['alloc']}: {r['status']}", "", "```",
                  r["log_tail"][-1200:].replace("```", "'''"), "```"]
        for d in r.get("ranks", []):
            if d.get("error"):
                lines += [f"rank {d.get('rank')} ({d.get('failed_in', '')}): {d['error'][:400]}"]
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "fake-launch":
        sys.exit(fake_launch_main(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out-dist"))
    p.add_argument("--budget", type=float, default=480, help="seconds for everything this script runs")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", type=int, default=2)
    p.add_argument("--models", default="gpt2,llama")
    p.add_argument("--steps", type=int, default=0, help="steps per launch (0: per-model default)")
    p.add_argument("--bisect", default="gpt2", help="models to bisect ('' for none)")
    p.add_argument("--allocs", default=",".join(ALLOCS), help="allocators for the uncapped launches")
    p.add_argument("--bisect-allocs", default=",".join(ALLOCS), help="allocators to bisect")
    p.add_argument("--probes", type=int, default=3, help="max probes per allocator")
    p.add_argument("--probe-steps", type=int, default=8)
    p.add_argument("--tol", type=float, default=0.005, help="bisection tolerance, fraction of live")
    p.add_argument("--dry-run", action="store_true", help="fake launcher and workers: no torch, no GPU")
    a = p.parse_args()
    if a.nproc_per_node < 1:
        p.error("--nproc-per-node must be >= 1")
    for m in a.models.split(","):
        if m and m not in MODELS:
            p.error(f"unknown model {m}")
    R = Runner(a)
    models = [m for m in a.models.split(",") if m]
    # Models to bisect first (the bisection needs their uncapped launches),
    # then the others, then the bisection with whatever time is left.
    first = [m for m in models if m in a.bisect.split(",")]
    steps_of = lambda m: a.steps or MODELS[m]["steps"]  # noqa: E731
    R.uncapped(first, a.allocs.split(","), steps_of, R.run)
    R.uncapped([m for m in models if m not in first], a.allocs.split(","), steps_of, R.run)
    for m in first:
        R.bisect(m)
    R.results["finished"] = time.strftime("%F %T")
    R.save()
    print(markdown(R.results))
    return 0 if all(r.get("status") == "ok" for r in R.results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
