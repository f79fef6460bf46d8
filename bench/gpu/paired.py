#!/usr/bin/env python3
"""Step times of bench/gpu/train.py runs, paired with the native run of the
same results.json, step by step: per configuration the median ratio over all
steps after the first, over the long (GPU-bound) steps only (common.long_steps:
sequence >= 0.7 x the longest, as train.py's table), and the ratio of summed
times over those long steps. Short steps of a variable-length model are
CPU-bound and move by +-20% between runs for every allocator alike (runs 21-24),
so the long steps are where an allocator's cost shows.

    python3 bench/gpu/paired.py RESULTS_DIR_OR_JSON... [--long-seq N] [--json]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import long_steps  # noqa: E402


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    with open(path) as f:
        return json.load(f)


def label(r):
    al = r.get("alloc", "?")
    if r.get("cap_factor"):
        al += f"@{r['cap_factor']}x"
    return al


def analyse(res, long_seq):
    runs = [r for r in res.get("runs", []) if r.get("status") == "ok" and r.get("step_times")]
    out = []
    for model in sorted({r["model"] for r in runs}):
        nat = next((r for r in runs if r["model"] == model and r["alloc"] == "native"), None)
        if not nat:
            continue
        for r in runs:
            if r["model"] != model or r is nat:
                continue
            t, n = r["step_times"], nat["step_times"]
            k = min(len(t), len(n))
            idx = list(range(1, k))  # step 0 builds the pool / warms up
            lng = long_steps(nat.get("seq_lens"), 1, k, long_seq)
            ratio = [t[i] / n[i] for i in idx]
            row = {"model": model, "config": label(r), "steps": len(idx), "paired_median": statistics.median(ratio)}
            if lng:
                row["long_steps"] = len(lng)
                row["long_paired_median"] = statistics.median(t[i] / n[i] for i in lng)
                row["long_sum_ratio"] = sum(t[i] for i in lng) / sum(n[i] for i in lng)
                row["long_extra_ms"] = 1e3 * (sum(t[i] for i in lng) - sum(n[i] for i in lng))
                # nofrag's time in backend calls over those steps (train.py's call_seconds_by_kind_by_step):
                # the driver's work, and apart from it the host waits (event_sync), which the GPU's
                # queued work may hide.
                cs = r.get("call_seconds_by_kind_by_step")
                if cs and len(cs) >= k:
                    row["long_calls_ms"] = 1e3 * sum(sum(v for kk, v in cs[i].items() if kk != "event_sync") for i in lng)
                    row["long_waits_ms"] = 1e3 * sum(cs[i].get("event_sync", 0) for i in lng)
            row["peak_reserved_over_live"] = (r.get("peak_physical") or r.get("peak_reserved") or 0) / max(
                1, r.get("peak_live") or 1)
            row["calls_per_steady_step"] = r.get("calls_per_steady_step")
            row["loss_equal_native"] = r.get("losses") == nat.get("losses")
            out.append(row)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+")
    p.add_argument("--long-seq", type=int, default=None,
                   help="a step of at least this sequence length is long (default: 0.7 x the longest)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    rows = []
    for path in a.paths:
        for row in analyse(load(path), a.long_seq):
            row["source"] = path
            rows.append(row)
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    print("| source | model | config | paired median (steps 1+) | long steps | long paired median | long sum ratio "
          "| long extra ms | in driver calls ms | in host waits ms | reserved/live | calls/step | loss = native |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        def f(k, fmt="{:.3f}"):
            v = r.get(k)
            return "" if v is None else fmt.format(v)
        print(f"| {r['source']} | {r['model']} | {r['config']} | {f('paired_median')} | {f('long_steps', '{}')} | "
              f"{f('long_paired_median')} | {f('long_sum_ratio')} | {f('long_extra_ms', '{:+.0f}')} | "
              f"{f('long_calls_ms', '{:.0f}')} | {f('long_waits_ms', '{:.0f}')} | "
              f"{f('peak_reserved_over_live', '{:.4f}')} | {f('calls_per_steady_step', '{:.1f}')} | "
              f"{r['loss_equal_native']} |")


if __name__ == "__main__":
    main()
