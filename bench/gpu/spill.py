#!/usr/bin/env python3
"""GPU proof of spill and same-address offload (issue 7).

Orchestrator (run by bench/gpu/run_spill.sh; every configuration in its own
subprocess with a timeout, results written after each run):

    python3 bench/gpu/spill.py --out $OUT --budget 420 [--parts spill,opt,act,actcap,savecpu,reserve] [--dry-run]

Worker (one training run, one JSON file, rewritten after every step):

    python3 bench/gpu/spill.py worker --model gpt2 --alloc nofrag --steps 12 [--cap B] [--spill]
        [--act-offload layers|exit] [--opt-offload early|late] [--fsdp] [--foreach 0|1] --json F

Models, data and settings are bench/gpu/train.py's (train.build,
train.seq_lengths, the per-step seeded CUDA generator) and common.py's
deterministic() (math SDPA, no TF32, deterministic algorithms), so losses
compare bit for bit across allocators; bf16 autocast, AdamW lr 1e-4.

1. spill (GPT-2 124M, batch 16, seq ~ U[64, 1024]: dynamic shapes, so only the
   long batches exceed a cap): nofrag uncapped first (reference losses, peak
   live = live_rounded_peak), then cap = peak live / 1.3 under PyTorch native
   (set_per_process_memory_fraction) and expandable_segments (expected to
   OOM) and nofrag limit:<cap>,spill:host. Also native uncapped. Reported:
   completes, losses identical to nofrag / native uncapped, median (and max)
   step time vs uncapped (target <= 1.5x), spilled_peak, spills, backend
   calls per step.
2. opt (Llama-style 1.1B, train.py's llama: gradient checkpointing, batch 4,
   seq ~ U[256, 2048]; AdamW foreach=False by default, see --foreach):
   (a) native, (b) nofrag + nofrag.torch.offload_optimizer(opt, mode="resident")
   (state created in host memory, used in place by the step),
   (c) native + FSDP2 fully_shard(offload_policy=CPUOffloadPolicy()) on world
   size 1 (optimizer step on the CPU). Peak device memory (native:
   max_memory_reserved; nofrag: physical_peak = device granules created),
   peak live, median step time, slowdown vs (a), and whether nofrag's
   slowdown is at most half of FSDP2's.
3. act (GPT-2 uncapped): nofrag + nofrag.torch.offload_activations(layers=
   the transformer blocks): losses identical?, peak device memory
   (physical_peak) vs the nofrag reference, step time. actcap: the same
   under the spill cap without spill (first 6 blocks, then all 12): does
   offloading let the run fit where nofrag alone OOMs, at what step time?
   savecpu: PyTorch's torch.autograd.graph.save_on_cpu(pin_memory=True) at
   the same cap, native and nofrag (a copy per saved tensor, new storage on
   unpack; the reference for what activation offload costs here).
4. reserve: spill at the cap with spill_reserve = peak live - cap (host
   granules made at pool creation: the first spill does not pin memory).

--dry-run replaces the workers by fakes without torch (tests orchestration,
comparisons and the report).
"""

import argparse
import contextlib
import json
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train  # noqa: E402  (model builders, per-step data, SEED, WARMUP)
from common import GiB, BudgetedRunner, base_env, deterministic, dry_banner, gib  # noqa: E402

STEPS = {"gpt2": 12, "llama": 10}
FSDP_STEPS = 8
TIMEOUT = {"gpt2": 120, "llama": 150, "fsdp": 220}
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
NF_KEYS = ("live_rounded_peak", "physical", "physical_peak", "mapped_peak", "spilled", "spilled_peak", "spills",
           "backend_calls", "offloaded", "host_physical_peak", "offloads", "prefetches")


# ====================================================================== worker

def _fsdp_api():
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    except ImportError:  # older layout
        from torch.distributed._composable.fsdp import CPUOffloadPolicy, fully_shard
    return fully_shard, CPUOffloadPolicy


def _layers(model, name):
    return model.model.layers if name == "llama" else model.transformer.h


def _per_step(cum):
    """Mean increase per step of a cumulative count, warm-up steps skipped."""
    d = [cum[i] - cum[i - 1] for i in range(max(1, train.WARMUP), len(cum))]
    return sum(d) / len(d) if d else None


def run_worker(a, res, dump):
    nft = None
    if a.alloc == "nofrag":
        import nofrag.torch as nft  # before torch initialises CUDA
        conf = {"limit": str(a.cap)} if a.cap else {}
        if a.spill:
            conf["spill"] = "host"
        if a.spill_reserve:
            conf["spill_reserve"] = str(a.spill_reserve)
        res["nofrag_install"] = nft.enable(**conf)
    import torch
    deterministic(torch, train.SEED)
    res["torch"] = torch.__version__
    res["env"] = {k: os.environ.get(k) for k in list(NO_MULTICAST) + ["PYTORCH_CUDA_ALLOC_CONF", "MASTER_PORT"]}
    total = torch.cuda.mem_get_info()[1]
    res.update(device_total=total, device_name=torch.cuda.get_device_name(0))
    if a.cap and a.alloc != "nofrag":
        res["fraction"] = min(1.0, a.cap / total)
        torch.cuda.set_per_process_memory_fraction(float(res["fraction"]), 0)
    dist = None
    if a.fsdp:
        import torch.distributed as dist
        torch.cuda.set_device(0)
        try:
            dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
        except TypeError:
            dist.init_process_group("nccl")
    res["status"] = "building"
    dump()
    model, vocab = train.build(a.model, torch)
    if nft is not None:
        res["nofrag_config"] = train._nofrag_conf()
    if a.fsdp:
        fully_shard, CPUOffloadPolicy = _fsdp_api()
        res["fsdp_api"] = fully_shard.__module__
        for layer in _layers(model, a.model):
            fully_shard(layer, offload_policy=CPUOffloadPolicy())
        fully_shard(model, offload_policy=CPUOffloadPolicy())
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the model was built on the device; measure from here
        torch.cuda.reset_peak_memory_stats()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=False, foreach=bool(a.foreach))
    handle = None
    if a.opt_offload:
        if a.opt_offload == "resident":
            handle = nft.offload_optimizer(opt, mode="resident")
        else:
            handle = nft.offload_optimizer(opt, prefetch_in_backward=(a.opt_offload == "early"))
    act_layers = list(_layers(model, a.model)) if a.act_offload == "layers" else None
    if act_layers and a.act_layers:
        act_layers = act_layers[:a.act_layers]  # the first blocks: backward needs them last
    lens = train.seq_lengths(a.model, a.steps)
    batch = train.MODELS[a.model]["batch"]
    gen = torch.Generator(device="cuda")
    losses, times, per_step = [], [], []
    res["status"] = "running"
    for step in range(a.steps):
        gen.manual_seed(train.SEED * 1000 + step)
        x = torch.randint(0, vocab, (batch, lens[step]), device="cuda", generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if a.act_offload == "save_on_cpu":
            ctx = torch.autograd.graph.save_on_cpu(pin_memory=True)
        elif a.act_offload:
            ctx = nft.offload_activations(min_bytes=4 << 20, ahead=a.ahead, layers=act_layers)
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()).hex())
        if nft is not None:
            s = nft.stats(0)
            per_step.append({k: s.get(k, 0) for k in NF_KEYS})
        else:
            ms = torch.cuda.memory_stats()
            per_step.append({"peak_live": torch.cuda.max_memory_allocated(),
                             "peak_reserved": torch.cuda.max_memory_reserved(),
                             "driver_calls": ms.get("num_device_alloc", 0) + ms.get("num_device_free", 0)})
        if a.act_offload and a.act_offload != "save_on_cpu":
            res["act_offload_stats"] = dict(ctx.stats)
        res.update(losses=losses, step_times=times, seq_lens=lens[:step + 1], per_step=per_step,
                   steps_done=step + 1)
        dump()
        del x, loss
    warm = times[train.WARMUP:] or times
    res.update(median_step_s=statistics.median(warm), mean_step_s=statistics.mean(warm), max_step_s=max(warm))
    if nft is not None:
        s = nft.stats(0)
        res["nofrag_stats"] = s
        res.update(peak_live=s["live_rounded_peak"], peak_requested=s["live_peak"], peak_device=s["physical_peak"],
                   peak_mapped=s["mapped_peak"], spilled_peak=s.get("spilled_peak", 0), spills=s.get("spills", 0),
                   host_physical_peak=s.get("host_physical_peak", 0),
                   calls_per_step=_per_step([p["backend_calls"] for p in per_step]))
    else:
        res.update(peak_live=torch.cuda.max_memory_allocated(), peak_device=torch.cuda.max_memory_reserved(),
                   calls_per_step=_per_step([p["driver_calls"] for p in per_step]))
    if handle is not None:
        res["opt_offload_stats"] = dict(handle.stats)
        handle.remove()
    if dist is not None:
        dist.destroy_process_group()
    res["status"] = "ok"


def dry_worker(a, res, dump):
    """Obviously synthetic numbers without torch (not measurements), shaped
    like the real outcomes: native/expandable OOM under a cap, nofrag spills,
    offload costs time and saves device memory."""
    res["dry_run"] = True
    live = {"gpt2": 40, "llama": 20}[a.model] * GiB
    t = {"gpt2": 1.0, "llama": 2.0}[a.model]
    losses = [(10.0 - i / 8).hex() for i in range(a.steps)]
    dev = live * (1.125 if a.alloc == "nofrag" else 1.5)
    oom_at = None
    if a.cap and not ((a.alloc == "nofrag" and (a.spill or a.act_offload)) or a.act_offload == "save_on_cpu"):
        oom_at = 4
    if a.spill and a.cap:
        t, dev = t * 1.25, a.cap
        res.update(spilled_peak=int(live - a.cap), spills=100)
    if a.fsdp:
        t, dev, losses = t * 4.0, live * 0.5, [(10.0 - i / 8 + 1e-6).hex() for i in range(a.steps)]
    if a.opt_offload:
        t, dev = t * 1.5, live * 0.75
        res["opt_offload_stats"] = {"offloaded_bytes": int(a.steps * 4 * GiB)}
    if a.act_offload:
        t, dev = t * 2.0, live * (0.5 if a.act_offload == "layers" else 1.125)
        res["act_offload_stats"] = {"offloaded_bytes": int(10 * GiB)}
    times = [t * (1.0 + 0.1 * (i % 3)) for i in range(a.steps)]
    n = oom_at if oom_at is not None else a.steps
    lens = train.seq_lengths(a.model, a.steps)
    res.update(losses=losses[:n], step_times=times[:n], steps_done=n, seq_lens=lens[:n])
    if a.spill and a.cap:  # the long sequences spill
        res["per_step"] = [{"spills": 10 * sum(1 for x in lens[:i + 1] if x > 850)} for i in range(n)]
    if oom_at is not None:
        res.update(status="oom", error="OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB (dry run)")
        return 3
    warm = times[train.WARMUP:]
    res.update(status="ok", median_step_s=statistics.median(warm), mean_step_s=statistics.mean(warm),
               max_step_s=max(warm), peak_live=int(live), peak_device=int(dev),
               calls_per_step=3.0 if a.alloc == "nofrag" else 1.0)
    return 0


def worker_main(argv):
    p = argparse.ArgumentParser(prog="spill.py worker")
    p.add_argument("--name", default="")
    p.add_argument("--model", required=True, choices=sorted(STEPS))
    p.add_argument("--alloc", required=True, choices=("native", "expandable", "nofrag"))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--cap", type=int, default=0, help="memory cap in bytes (0: none)")
    p.add_argument("--spill", action="store_true", help="nofrag: spill:host")
    p.add_argument("--act-offload", choices=("layers", "exit", "save_on_cpu"), default=None,
                   help="nofrag.torch.offload_activations (layers, exit) or torch's save_on_cpu(pin_memory=True)")
    p.add_argument("--act-layers", type=int, default=0, help="with --act-offload layers: only the first N blocks")
    p.add_argument("--spill-reserve", type=int, default=0, help="nofrag spill_reserve in bytes")
    p.add_argument("--ahead", type=int, default=4, help="activation storages prefetched ahead")
    p.add_argument("--opt-offload", choices=("early", "late", "resident"), default=None,
                   help="offload_optimizer; resident: state lives in host memory, used in place; early/late: "
                        "swapped in before each step (early: from backward on) and out after")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 with CPUOffloadPolicy (world size 1)")
    p.add_argument("--foreach", type=int, default=0)
    p.add_argument("--json", required=True)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    if (a.spill or a.act_offload not in (None, "save_on_cpu") or a.opt_offload) and a.alloc != "nofrag":
        p.error("--spill / --act-offload / --opt-offload need --alloc nofrag")
    res = {k: v for k, v in vars(a).items() if k not in ("json", "dry_run")}
    res["status"] = "started"

    def dump():
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f)
        os.replace(tmp, a.json)

    dump()
    if a.dry_run:
        rc = dry_worker(a, res, dump)
        dump()
        return rc
    try:
        run_worker(a, res, dump)
        dump()
        return 0
    except BaseException as e:
        import traceback
        msg = f"{type(e).__name__}: {e}"
        oom = "out of memory" in msg.lower() or type(e).__name__ == "OutOfMemoryError"
        res.update(status="oom" if oom else "error", error=msg[:2000], traceback=traceback.format_exc()[-4000:])
        dump()
        print(msg[:500], file=sys.stderr)
        return 3 if oom else 1


# ================================================================ orchestrator

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runner(BudgetedRunner):
    def __init__(self, a):
        self.a = a
        super().__init__(a.out, a.budget, {"started": time.strftime("%F %T"), "budget_s": a.budget,
                                           "dry_run": a.dry_run, "runs": {}, "cap": None, "cap_div": a.cap_div},
                         markdown)
        os.makedirs(os.path.join(a.out, "runs"), exist_ok=True)

    def run(self, name, model, alloc, steps=None, timeout=None, **opts):
        steps = steps or STEPS[model]
        timeout = self.timeout_for(timeout or TIMEOUT[model], 25)
        if timeout is None:
            res = {"name": name, "model": model, "alloc": alloc, "status": "skipped (time budget)"}
            self.results["runs"][name] = res
            self.save()
            return res
        self.n += 1
        base = os.path.join(self.a.out, "runs", f"{self.n:02d}-{name.replace('/', '-')}")
        cmd = [sys.executable, os.path.abspath(__file__), "worker", "--name", name, "--model", model, "--alloc",
               alloc, "--steps", str(steps), "--json", base + ".json", "--foreach", str(self.a.foreach)]
        for k, v in opts.items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                cmd.append(flag)
            elif v not in (None, False, 0):
                cmd += [flag, str(v)]
        if self.a.dry_run:
            cmd.append("--dry-run")
        env = base_env(alloc)
        env.update(NO_MULTICAST)
        if opts.get("fsdp"):
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                       WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        t0 = time.time()
        rc = self.launch(cmd, env, base + ".log", timeout)
        res = self.settle(self.load_json(base + ".json", {"name": name, "model": model, "alloc": alloc}), rc,
                          timeout, base + ".log", ("started", "building", "running", None), 1500)
        res.update(rc=rc, elapsed_s=round(time.time() - t0, 1), cmd=" ".join(cmd[1:]))
        self.results["runs"][name] = res
        self.save()
        self.report(name, res)
        return res


def plan(R, parts):
    a = R.a
    m = a.spill_model
    cap = 0
    if parts & {"spill", "reserve", "act", "actcap", "savecpu"}:
        ref = R.run("spill/nofrag-uncapped", m, "nofrag")
        if ref.get("status") == "ok" and ref.get("peak_live"):
            cap = int(ref["peak_live"] / a.cap_div)
            R.results["cap"] = cap
    if "spill" in parts:
        if cap:
            R.run("spill/nofrag-spill-cap", m, "nofrag", cap=cap, spill=True)
            R.run("spill/native-cap", m, "native", cap=cap)
            R.run("spill/expandable-cap", m, "expandable", cap=cap)
        R.run("spill/native-uncapped", m, "native")
    if "opt" in parts:
        R.run("opt/a-native", "llama", "native")
        R.run("opt/b-nofrag-offload", "llama", "nofrag", opt_offload="resident")
        R.run("opt/c-fsdp2-cpu-offload", "llama", "native", steps=FSDP_STEPS, timeout=TIMEOUT["fsdp"], fsdp=True)
    if "reserve" in parts and cap:  # host granules made at pool creation: the first spill pays no pinning
        R.run("spill/nofrag-spill-reserve-cap", m, "nofrag", cap=cap, spill=True,
              spill_reserve=int(ref["peak_live"]) - cap)
    if "act" in parts:
        R.run("act/nofrag-layers", m, "nofrag", act_offload="layers")
    if "actcap" in parts and cap:  # offload instead of spill: the first 6 blocks (GPT-2 has 12), then all
        R.run("act/nofrag-6-layers-cap", m, "nofrag", cap=cap, act_offload="layers", act_layers=6)
        R.run("act/nofrag-layers-cap", m, "nofrag", cap=cap, act_offload="layers")
    if "savecpu" in parts and cap:  # PyTorch's own remedy at the same cap: every saved tensor to pinned memory
        R.run("act/native-save-on-cpu-cap", m, "native", cap=cap, act_offload="save_on_cpu")
        R.run("act/nofrag-save-on-cpu-cap", m, "nofrag", cap=cap, act_offload="save_on_cpu")
    # Controls, with whatever time is left.
    if "opt" in parts:
        R.run("opt/nofrag-no-offload", "llama", "nofrag")
        R.run("opt/nofrag-swap-offload", "llama", "nofrag", opt_offload="early")
    if "spill" in parts and cap:
        R.run("spill/nofrag-cap-no-spill", m, "nofrag", cap=cap)
    if "act" in parts:
        R.run("act/nofrag-exit", m, "nofrag", act_offload="exit")


# ================================================================ report

def same_losses(r, ref):
    if not r or not ref or not r.get("losses") or not ref.get("losses"):
        return "n/a"
    a, b = r["losses"], ref["losses"]
    n = min(len(a), len(b))
    diff = next((i for i in range(n) if a[i] != b[i]), None)
    if diff is not None:
        return f"no (step {diff})"
    return "yes" if len(a) == len(b) else f"yes for {n} steps"


def ratio(r, ref, key="median_step_s"):
    if r and ref and r.get(key) and ref.get(key):
        return r[key] / ref[key]
    return None


def spilled_steps(r):
    """Steps during which nofrag took host granules for an allocation: (k, n)."""
    cum = [p.get("spills", 0) for p in (r or {}).get("per_step") or []]
    if not cum:
        return None
    return sum(1 for i, c in enumerate(cum) if c > (cum[i - 1] if i else 0)), len(cum)


def f3(x):
    return "" if x is None else f"{x:.3f}"


def row(r, cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown(R):
    runs = R["runs"]
    g = runs.get
    L = [f"# Spill and same-address offload on the GPU (bench/gpu/spill.py){' -- DRY RUN' if R.get('dry_run') else ''}",
         "", *dry_banner(R),
         f"Started {R.get('started')}, budget {R.get('budget_s')} s. Peak device = max_memory_reserved "
         "(PyTorch) or physical_peak (nofrag: device granules created; host granules not counted). Peak live = "
         "max_memory_allocated / live_rounded_peak (offloaded and spilled blocks still count as live). Step "
         "times: median over the steps after the warm-up; calls/step: nofrag backend calls or PyTorch "
         "num_device_alloc+free per step.", ""]
    ref, nat = g("spill/nofrag-uncapped"), g("spill/native-uncapped")
    spill_runs = [k for k in runs if k.startswith("spill/")]
    if spill_runs:
        cap = R.get("cap")
        L += ["## 1. Spill: training under a cap below the peak", "",
              f"Model {(ref or {}).get('model', '?')}; cap = nofrag uncapped peak live / {R.get('cap_div')} = "
              f"{gib(cap) or '?'} GiB.", "",
              "| run | status | steps done | losses = nofrag uncapped | losses = native uncapped | median step s "
              "| vs nofrag uncapped | max step s | peak live GiB | peak device GiB | spilled peak GiB | spills "
              "| calls/step |", "|" + " --- |" * 13]
        for k in spill_runs:
            r = runs[k]
            L.append(row(r, [k, r.get("status"), r.get("steps_done", ""), same_losses(r, ref) if r is not ref else "-",
                             same_losses(r, nat) if r is not nat else "-", f3(r.get("median_step_s")),
                             f3(ratio(r, ref)), f3(r.get("max_step_s")), gib(r.get("peak_live")),
                             gib(r.get("peak_device")), gib(r.get("spilled_peak")), r.get("spills", ""),
                             f3(r.get("calls_per_step"))]))
        sp = g("spill/nofrag-spill-cap")
        if sp:
            rt = ratio(sp, ref)
            ks = spilled_steps(sp)
            L += ["", f"- nofrag limit+spill:host completes: **{'yes' if sp.get('status') == 'ok' else 'NO'}**; "
                      f"losses bit-identical to nofrag uncapped: **{same_losses(sp, ref)}**, to native uncapped: "
                      f"**{same_losses(sp, nat)}**; median step ratio {f3(rt)} (target <= 1.5: "
                      f"**{'met' if rt is not None and rt <= 1.5 else 'NOT met'}**), mean {f3(ratio(sp, ref, 'mean_step_s'))}"
                      f", max-step ratio {f3(ratio(sp, ref, 'max_step_s'))}; steps that spilled: "
                      f"{'%d of %d' % ks if ks else '?'} (sequence lengths {sp.get('seq_lens')})."]
        rs = g("spill/nofrag-spill-reserve-cap")
        if rs:
            L += [f"- with spill_reserve = peak live - cap ({gib(rs.get('spill_reserve'))} GiB of host granules made "
                  f"at pool creation): {rs.get('status')}, losses = nofrag uncapped: **{same_losses(rs, ref)}**; "
                  f"median step ratio {f3(ratio(rs, ref))}, mean {f3(ratio(rs, ref, 'mean_step_s'))}, max-step "
                  f"ratio {f3(ratio(rs, ref, 'max_step_s'))}."]
        for k in ("spill/native-cap", "spill/expandable-cap", "spill/nofrag-cap-no-spill"):
            r = g(k)
            if r:
                L.append(f"- {k}: {r.get('status')} after {r.get('steps_done', 0)} steps"
                         + (f" ({r.get('error', '')[:160]})" if r.get("error") else ""))
        L.append("")
    a_, b_, c_ = g("opt/a-native"), g("opt/b-nofrag-offload"), g("opt/c-fsdp2-cpu-offload")
    if a_ or b_ or c_:
        L += ["## 2. Optimizer state offload (Llama-style 1.1B, AdamW)", "",
              "| run | status | median step s | slowdown vs (a) | peak device GiB | peak live GiB | losses = (a) "
              "| offloaded total (swap) / host-resident (resident) GiB |", "|" + " --- |" * 8]
        for k in [k for k in runs if k.startswith("opt/")]:
            r = runs[k]
            rt = ratio(r, a_)
            st_ = r.get("opt_offload_stats") or {}
            off = st_.get("offloaded_bytes") or st_.get("host_bytes")
            L.append(row(r, [k, r.get("status"), f3(r.get("median_step_s")), "" if rt is None else f"{rt - 1:+.3f}",
                             gib(r.get("peak_device")), gib(r.get("peak_live")),
                             same_losses(r, a_) if r is not a_ else "-", gib(off)]))
        rb, rc_ = ratio(b_, a_), ratio(c_, a_)
        if rb is not None and rc_ is not None:
            sb, sc = rb - 1, rc_ - 1
            L += ["", f"- slowdown: nofrag offload_optimizer {sb:+.3f}, FSDP2 CPUOffloadPolicy {sc:+.3f}; nofrag's "
                      f"slowdown <= half of FSDP2's: **{'yes' if sb <= 0.5 * sc else 'NO'}**."]
        if a_ and b_ and a_.get("peak_device") and b_.get("peak_device"):
            L.append(f"- peak device memory: (a) {gib(a_['peak_device'])} GiB, (b) {gib(b_['peak_device'])} GiB "
                     f"({b_['peak_device'] / a_['peak_device'] - 1:+.1%}), (c) {gib((c_ or {}).get('peak_device'))}"
                     " GiB. (b) creates the state in host memory at the first step and the step uses it there in "
                     "place (mode='resident'); the swap mode (control row) brings it back for each step, which "
                     "cannot lower the step's own peak (docs/offload.md).")
        L.append("")
    act = [k for k in runs if k.startswith("act/")]
    if act:
        L += ["## 3. Activation offload (nofrag.torch.offload_activations)", "",
              "| run | status | cap GiB | losses = nofrag uncapped | median step s | vs nofrag uncapped "
              "| peak device GiB | vs nofrag uncapped | peak live GiB | offloaded GiB (last step) | calls/step |",
              "|" + " --- |" * 11]
        for k in act:
            r = runs[k]
            off = (r.get("act_offload_stats") or {}).get("offloaded_bytes")
            dv = ratio(r, ref, "peak_device")
            L.append(row(r, [k, r.get("status"), gib(r.get("cap")) or "-", same_losses(r, ref),
                             f3(r.get("median_step_s")), f3(ratio(r, ref)), gib(r.get("peak_device")),
                             "" if dv is None else f"{dv - 1:+.1%}", gib(r.get("peak_live")), gib(off),
                             f3(r.get("calls_per_step"))]))
        L += ["", "layers: each transformer block's saved activations move when the block returns (6-layers: the "
                  "first 6 blocks only); exit: all at the end of forward (cannot lower the forward's peak); save-on-cpu: "
                  "torch.autograd.graph.save_on_cpu(pin_memory=True), every saved tensor copied to pinned memory. "
                  "Uncapped, the pool grows instead of waiting for offload copies, so the peak shows what the "
                  "offload can save only under a cap (-cap rows: limit set, no spill)."]
    bad = [(k, r) for k, r in runs.items() if r.get("status") not in ("ok",) and r.get("log_tail")]
    if bad:
        L += ["", "## Failures (log tails)", ""]
        for k, r in bad:
            L += [f"### {k}: {r.get('status')}", "", "```", r["log_tail"][-800:], "```", ""]
    return "\n".join(L) + "\n"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--budget", type=float, default=420, help="seconds for everything this script runs")
    p.add_argument("--parts", default="spill,opt,act")
    p.add_argument("--spill-model", default="gpt2", choices=sorted(STEPS))
    p.add_argument("--cap-div", type=float, default=1.3, help="cap = uncapped peak live / this")
    p.add_argument("--foreach", type=int, default=0, help="AdamW foreach (0: per-tensor step, small temporaries)")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    R = Runner(a)
    R.save()
    plan(R, set(x for x in a.parts.split(",") if x))
    R.results["finished"] = time.strftime("%F %T")
    R.save()
    print(markdown(R.results))


if __name__ == "__main__":
    main()
