#!/usr/bin/env python3
"""CuPy on nofrag (nofrag.cupy.enable): a CuPy workload that fragments CuPy's
own memory pool, and the smallest memory cap under which it completes, for
CuPy's pool and for nofrag. Data written into every array is read back and
checked under both.

    python3 bench/gpu/cupy_frag.py --lib build/libnofrag.so      # on the GPU machine (CuPy installed)
    python3 bench/gpu/cupy_frag.py --dry-run                     # anywhere: checks the plumbing, measures nothing

The workload (deterministic; --unit scales it, default 32 MiB) runs --rounds
rounds of: a transient workspace as large as the round's arrays, freed at
once (CuPy keeps its segment cached); then arrays of 1-4 units, each filled
with its own pattern, of which every other one is dropped. The survivors are
scattered through the workspace's segment with holes between them, so CuPy
can neither reuse the holes for larger requests nor give the segment back
(free_all_blocks only releases wholly free segments). Last, one large array
(--final units) is allocated and every surviving array is verified.

Caps: CuPy's pool via MemoryPool.set_limit(size=cap), nofrag via
nofrag.cupy.enable(limit=cap). Each trial (one allocator, one cap) runs in
its own subprocess so no state carries over. For each allocator the cap is
bisected (to --resolution MiB) between the planned peak of live bytes (no
allocator can do with less) and a cap that works (doubling from there).

Output: a table on stdout and JSON in $OUT/cupy_frag.json (or --json PATH).
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
MiB, GiB = 1 << 20, 1 << 30


# ------------------------------------------------------------------ workload

def plan(unit, rounds, per_round, final):
    """The workload as a list of steps (deterministic): ("alloc", id, bytes),
    ("free", id). Shared by the trials and by the peak-live computation."""
    steps, nid = [], 0
    for r in range(rounds):
        sizes = [unit * (1 + (i * 7 + r) % 4) for i in range(per_round)]
        ws = nid
        steps.append(("alloc", ws, sum(sizes)))  # the workspace
        steps.append(("free", ws))
        nid += 1
        ids = list(range(nid, nid + per_round))
        nid += per_round
        for i, s in zip(ids, sizes):
            steps.append(("alloc", i, s))
        for i in ids[1::2]:
            steps.append(("free", i))
    steps.append(("alloc", nid, final * unit))
    return steps


def peak_live(steps):
    live = peak = 0
    sizes = {}
    for st in steps:
        if st[0] == "alloc":
            sizes[st[1]] = st[2]
            live += st[2]
            peak = max(peak, live)
        else:
            live -= sizes.pop(st[1])
    return peak


def run_trial(args):
    """One trial in this process: returns a dict (printed as JSON)."""
    import cupy as cp
    steps = plan(args.unit * MiB, args.rounds, args.per_round, args.final)
    mempool = cp.get_default_memory_pool()
    pool = None
    if args.trial == "nofrag":
        import nofrag.cupy
        pool = nofrag.cupy.enable(limit=args.cap)
    else:
        mempool.set_limit(size=args.cap)
    # Fill and check in place (no temporaries: they would change the
    # allocation pattern being measured). Pattern: index XOR a per-array seed.
    fill = cp.ElementwiseKernel("uint32 seed", "uint32 y", "y = (unsigned int)i ^ seed", "nf_fill")
    check = cp.ElementwiseKernel("uint32 x, uint32 seed", "raw uint32 bad",
                                 "if (x != ((unsigned int)i ^ seed)) atomicAdd(&bad[0], 1u);", "nf_check")

    def seed(i):
        return cp.uint32((i * 2654435761 + 12345) & 0xFFFFFFFF)

    arrays, held_peak = {}, 0
    t0 = time.time()
    try:
        for st in steps:
            if st[0] == "alloc":
                _, i, nbytes = st
                arrays[i] = cp.empty(nbytes // 4, dtype=cp.uint32)  # no other reference: del frees it
                fill(seed(i), arrays[i])
            else:
                del arrays[st[1]]
            held = pool.stats()["physical"] if pool else mempool.total_bytes()
            held_peak = max(held_peak, held)
        bad_count = cp.zeros(1, dtype=cp.uint32)
        bad = []
        for i in arrays:
            bad_count.fill(0)
            check(arrays[i], seed(i), bad_count)
            if int(bad_count.get()[0]):
                bad.append(i)
        cp.cuda.Device().synchronize()
        out = {"ok": not bad, "verified": not bad, "bad_arrays": bad, "held_peak": held_peak,
               "arrays_checked": len(arrays), "seconds": round(time.time() - t0, 3)}
        if pool:
            st = pool.stats()
            out["nofrag"] = {k: st[k] for k in ("physical_peak", "mapped_peak", "live_peak", "allocs", "frees",
                                                "reclaims", "ooms")}
        return out
    except (cp.cuda.memory.OutOfMemoryError, MemoryError) as e:
        return {"ok": False, "oom": True, "error": str(e)[:300], "held_peak": held_peak}


# ------------------------------------------------------------------ driver

def trial(args, alloc, cap, dry=False):
    """Run one trial in a subprocess; its JSON result (or a failure dict)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--trial", alloc, "--cap", str(cap), "--unit", str(args.unit),
           "--rounds", str(args.rounds), "--per-round", str(args.per_round), "--final", str(args.final)]
    if dry:
        cmd.append("--dry-run")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    if args.lib:
        env["NOFRAG_LIB"] = os.path.abspath(args.lib)
    env.setdefault("NOFRAG_QUIET_OOM", "1")  # OOMs are the probe's answer, not news
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.trial_timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {args.trial_timeout} s"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"ok": False, "error": f"exit {r.returncode}: {(r.stderr or r.stdout)[-600:]}"}
    return json.loads(lines[-1])


def min_cap(args, alloc, lo, deadline, log):
    """Smallest cap (multiple of the resolution) under which `alloc`
    completes with data verified, by doubling then bisection."""
    res = args.resolution * MiB
    probes = []

    def ok(cap):
        r = trial(args, alloc, cap)
        probes.append({"cap": cap, **{k: r.get(k) for k in ("ok", "oom", "error", "held_peak")}})
        log(f"  {alloc:6s} cap {cap / GiB:8.3f} GiB: {'ok' if r.get('ok') else 'fails'}"
            + (f" ({r['error'][:120]})" if r.get("error") and not r.get("oom") else ""))
        return r

    lo = (lo // res) * res  # below the peak of live bytes nothing can work
    hi, best = lo, None
    while time.time() < deadline:
        r = ok(hi)
        if r.get("ok"):
            best = r
            break
        if not r.get("oom"):  # a crash or a wrong result is not a cap problem
            return {"error": r.get("error") or f"data not verified: {r.get('bad_arrays')}", "probes": probes}
        if hi >= args.max_cap * GiB:
            return {"error": f"no cap up to --max-cap {args.max_cap} GiB worked", "probes": probes}
        lo, hi = hi, min(hi * 2, int(args.max_cap * GiB) // res * res)
    if best is None:
        return {"error": "time budget spent", "probes": probes}
    while hi - lo > res and time.time() < deadline:
        mid = ((lo + hi) // 2 // res) * res
        if mid <= lo:
            break
        r = ok(mid)
        if r.get("ok"):
            hi, best = mid, r
        else:
            lo = mid
    return {"min_cap": hi, "exact": hi - lo <= res, "result": best, "probes": probes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", help="libnofrag.so to use (sets NOFRAG_LIB for the trials)")
    ap.add_argument("--dry-run", action="store_true", help="no CuPy, no GPU: check the plumbing, measure nothing")
    ap.add_argument("--unit", type=int, default=32, help="size unit in MiB (default 32)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=32)
    ap.add_argument("--final", type=int, default=64, help="the last array, in units (default 64)")
    ap.add_argument("--resolution", type=int, default=64, help="bisection resolution in MiB (default 64)")
    ap.add_argument("--max-cap", type=float, default=120, help="largest cap tried, GiB (default 120)")
    ap.add_argument("--budget", type=float, default=400, help="seconds for the whole search (default 400)")
    ap.add_argument("--trial-timeout", type=float, default=120)
    ap.add_argument("--json", help="JSON output (default $OUT/cupy_frag.json when OUT is set)")
    ap.add_argument("--trial", choices=["cupy", "nofrag"], help=argparse.SUPPRESS)
    ap.add_argument("--cap", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.trial:  # a subprocess of the driver
        if args.dry_run:
            print(json.dumps({"ok": True, "dry_run": True, "trial": args.trial}))
        else:
            print(json.dumps(run_trial(args)))
        return 0

    steps = plan(args.unit * MiB, args.rounds, args.per_round, args.final)
    peak = peak_live(steps)
    n_alloc = sum(1 for s in steps if s[0] == "alloc")
    out_path = args.json or (os.path.join(os.environ["OUT"], "cupy_frag.json") if os.environ.get("OUT") else None)
    R = {"dry_run": args.dry_run, "workload": {"unit_mib": args.unit, "rounds": args.rounds,
                                                "per_round": args.per_round, "final_units": args.final,
                                                "allocations": n_alloc, "planned_peak_live": peak},
         "allocators": {}}

    def save():
        if out_path:
            os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
            with open(out_path, "w") as f:
                json.dump(R, f, indent=1)

    def log(msg):
        print(msg, flush=True)

    log(f"workload: {n_alloc} allocations, {args.rounds} rounds x {args.per_round} arrays of 1-4 x {args.unit} MiB "
        f"after a workspace each, then {args.final * args.unit} MiB; peak live {peak / GiB:.3f} GiB (planned)")

    if args.dry_run:
        # Import and load what a real run needs, run one trial subprocess per
        # allocator in dry mode (no CuPy), and report nothing as measured.
        sys.path.insert(0, os.path.join(ROOT, "python"))
        if args.lib:
            os.environ["NOFRAG_LIB"] = os.path.abspath(args.lib)
        import nofrag
        import nofrag.cupy  # noqa: F401
        try:
            lib = nofrag._lib.path()
        except nofrag.NofragError as e:
            lib = f"not loadable: {e}"
        R["library"] = lib
        for alloc in ("cupy", "nofrag"):
            r = trial(args, alloc, peak, dry=True)
            R["allocators"][alloc] = {"dry_run": True, "trial_plumbing_ok": bool(r.get("ok") and r.get("dry_run")),
                                      "min_cap": None}
        save()
        log("DRY RUN: nothing measured (no CuPy, no GPU); library: " + str(lib))
        log(f"{'allocator':10s} {'min cap GiB':>12s} {'cap/peak live':>14s} {'verified':>9s}")
        for alloc, a in R["allocators"].items():
            log(f"{alloc:10s} {'-':>12s} {'-':>14s} {'-':>9s}   (trial plumbing {'ok' if a['trial_plumbing_ok'] else 'BROKEN'})")
        if out_path:
            log(f"DRY RUN JSON: {out_path}")
        return 0 if all(a["trial_plumbing_ok"] for a in R["allocators"].values()) else 1

    try:
        import cupy  # noqa: F401
    except ImportError:
        log("cupy_frag: CuPy is not installed (pip install cupy-cuda12x), or use --dry-run")
        return 2
    deadline = time.time() + args.budget
    for alloc in ("cupy", "nofrag"):
        log(f"{alloc}: searching the smallest cap")
        R["allocators"][alloc] = min_cap(args, alloc, peak, deadline - (args.budget / 2 if alloc == "cupy" else 0), log)
        save()
    log("")
    log(f"{'allocator':10s} {'min cap GiB':>12s} {'cap/peak live':>14s} {'verified':>9s}")
    for alloc, a in R["allocators"].items():
        if "min_cap" in a:
            log(f"{alloc:10s} {a['min_cap'] / GiB:12.3f} {a['min_cap'] / peak:14.3f} "
                f"{str(a['result'].get('verified')):>9s}" + ("" if a["exact"] else "  (bisection cut short)"))
        else:
            log(f"{alloc:10s} {'-':>12s} {'-':>14s} {'-':>9s}  {a['error'][:200]}")
    c, n = R["allocators"]["cupy"], R["allocators"]["nofrag"]
    if "min_cap" in c and "min_cap" in n:
        R["saving"] = {"bytes": c["min_cap"] - n["min_cap"], "ratio": c["min_cap"] / n["min_cap"]}
        log(f"nofrag fits in {n['min_cap'] / GiB:.3f} GiB where CuPy's pool needs {c['min_cap'] / GiB:.3f} GiB "
            f"({R['saving']['ratio']:.2f}x)")
    save()
    ok = all(a.get("result", {}).get("verified") for a in R["allocators"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
