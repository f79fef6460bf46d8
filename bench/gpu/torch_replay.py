# Replay a nofrag text trace's calls (alloc / free_completed) through the real
# PyTorch caching allocator on the GPU, to check the replay models
# (src/replay/model_native.c, model_expandable.c) against the allocator they
# model: raw alloc / delete through torch.cuda, each limit set with
# set_per_process_memory_fraction, and the same 2 MiB bisection as
# `nofrag replay --min-capacity`. One process per allocator configuration:
#
#   python3 bench/gpu/torch_replay.py OUT.json bisect data/gpt2.trace.gz data/llama1b_ga4_ckpt.trace.gz
#   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 bench/gpu/torch_replay.py OUT.json bisect ...
#   python3 bench/gpu/torch_replay.py OUT.json limits:L1,L2 TRACE   # given limits only
#
# Per probe: completed or not, peak reserved / allocated, retries, device
# allocs and frees (torch.cuda.memory_stats), to compare with
# `nofrag replay TRACE --json --limit L` (native / expandable columns).
# Traces with more than one side stream are refused (the recorded ones have one).
import gzip, json, sys, time
import torch

G = 2 << 20


def load(path):
    ops, live, cur, peak, streams = [], {}, 0, 0, set()
    with gzip.open(path, "rt") as f:
        for line in f:
            if not line or line[0] == "#":
                continue
            p = line.split()
            if len(p) < 4:
                continue
            a = p[0]
            if a == "alloc":
                addr, size, st = int(p[1]), int(p[2]), int(p[3])
                ops.append((0, addr, size, st))
                streams.add(st)
                live[addr] = size
                cur += size
                peak = max(peak, cur)
            elif a == "free_completed":
                addr = int(p[1])
                if addr in live:
                    cur -= live.pop(addr)
                    ops.append((1, addr, 0, 0))
    return ops, peak, sorted(streams)


TOTAL = torch.cuda.get_device_properties(0).total_memory
raw_alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc
raw_delete = torch._C._cuda_cudaCachingAllocator_raw_delete


def run(ops, smap, limit):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, (limit + (1 << 20)) / TOTAL) if limit else 1.0)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    live = {}
    ok, done = True, 0
    t0 = time.time()
    try:
        for k, a, s, st in ops:
            if k == 0:
                live[a] = raw_alloc(s, smap[st])
            else:
                raw_delete(live.pop(a))
            done += 1
    except torch.OutOfMemoryError:
        ok = False
    dt = time.time() - t0
    m = torch.cuda.memory_stats()
    for p in live.values():
        raw_delete(p)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {
        "limit": limit, "ok": ok, "ops_done": done,
        "peak_reserved": m.get("reserved_bytes.all.peak"),
        "peak_allocated": m.get("allocated_bytes.all.peak"),
        "retries": m.get("num_alloc_retries"), "ooms": m.get("num_ooms"),
        "device_alloc": m.get("num_device_alloc"), "device_free": m.get("num_device_free"),
        "segments_peak": m.get("segment.all.peak"), "seconds": round(dt, 3),
    }


def main():
    out, mode, traces = sys.argv[1], sys.argv[2], sys.argv[3:]
    res = {"torch": torch.__version__, "total": TOTAL,
           "conf": torch._C._cuda_getAllocatorBackend() if hasattr(torch._C, "_cuda_getAllocatorBackend") else None,
           "traces": {}}
    side = torch.cuda.Stream()
    for tr in traces:
        ops, peak_live, streams = load(tr)
        smap = {}
        for st in streams:
            smap[st] = 0 if st == 0 else side.cuda_stream
        if len([s for s in streams if s != 0]) > 1:
            sys.exit(f"{tr}: more than one side stream ({streams}); this replay maps them all to one")
        r = {"peak_live": peak_live, "n_ops": len(ops), "probes": []}
        u = run(ops, smap, 0)
        r["uncapped"] = u
        if mode == "bisect":
            hi = (u["peak_reserved"] + G - 1) // G
            lo = (peak_live - 1) // G
            p = run(ops, smap, hi * G)
            r["probes"].append(p)
            while not p["ok"]:
                lo, hi = hi, hi * 2
                p = run(ops, smap, hi * G)
                r["probes"].append(p)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                p = run(ops, smap, mid * G)
                r["probes"].append(p)
                if p["ok"]:
                    hi = mid
                else:
                    lo = mid
            r["min_capacity"] = hi * G
            r["ratio"] = hi * G / peak_live
        else:
            for L in mode.split(":", 1)[1].split(","):
                r["probes"].append(run(ops, smap, int(L)))
        res["traces"][tr] = r
        print(tr, json.dumps({k: v for k, v in r.items() if k != "probes"}), flush=True)
    json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
