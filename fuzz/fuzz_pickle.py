#!/usr/bin/env python3
"""Deterministic mutation fuzzer for the PyTorch-snapshot converter
(python/nofrag/torch_trace.py, what `nofrag replay SNAPSHOT.pickle` runs).

libFuzzer cannot reach Python code, so this script does the same job with the
standard library only: it pickles a few small snapshots (every action, frames
with odd file names, gzip and not, pickle protocols 2-5), mutates their bytes
(bit flips, byte sets, interesting bytes, inserted/removed/duplicated runs,
splices of two inputs) and converts each result. The converter may refuse an
input only with its own SnapshotError (what `main` prints as a clean
"nofrag.torch_trace: ..." error); any other exception is a finding: the input
is written to ARTIFACT_DIR and the script exits 1. A converted trace must also
load back as lines of the trace format.

usage: fuzz_pickle.py [SECONDS] [--seed N] [--artifacts DIR]
Prints executions, new coverage keys (distinct outcome classes) and findings.
"""
import gzip
import io
import os
import pickle
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from nofrag import torch_trace  # noqa: E402


def seeds():
    frames = [{"filename": "/x/site-packages/torch/nn/module.py", "line": 1, "name": "fwd"},
              {"filename": "train.py", "line": 42, "name": "step"},
              {"filename": "odd\tname\u00e9.py", "line": 7, "name": "f\tg"}]
    ev = []
    for i, a in enumerate(torch_trace.ACTIONS + torch_trace.SKIPPED):
        ev.append({"action": a, "addr": 4096 * (i % 3), "size": 512 * i, "stream": 0, "time_us": i,
                   "frames": frames if i % 2 else []})
    snaps = [
        {"segments": [], "device_traces": [ev]},
        {"segments": [], "device_traces": [[ev[0], ev[2]], []]},
        {"device_traces": [[{"action": "alloc", "addr": 1, "size": 2, "stream": 3}]]},
        {"device_traces": []},
        [],
    ]
    out = []
    for s in snaps:
        for proto in (2, 4, 5):
            b = pickle.dumps(s, protocol=proto)
            out.append(b)
    out.append(gzip.compress(pickle.dumps(snaps[0], protocol=4), mtime=0))
    return out


INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, ord("("), ord("."), ord("]"), ord("}"), ord("K"), ord("J"),
               ord("X"), ord("\x8a"), ord("\x8c"), ord("\x94"), ord("e"), ord("u"), ord("s"), ord("t")]


def mutate(rng, data, pool):
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if not b:
            b.append(rng.randrange(256))
            continue
        k = rng.randrange(len(b))
        if op == 0:
            b[k] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[k] = rng.randrange(256)
        elif op == 2:
            b[k] = rng.choice(INTERESTING)
        elif op == 3:
            b[k:k] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 4:
            del b[k:k + rng.randint(1, 8)]
        elif op == 5:
            n = rng.randint(1, 16)
            b[k:k] = b[k:k + n] * rng.randint(1, 4)
        else:
            other = rng.choice(pool)
            j = rng.randrange(len(other) + 1)
            b = b[:k] + bytearray(other[j:])
    return bytes(b[:1 << 16])


def run_one(data, src, dst):
    """Convert `data`; returns an outcome key for coverage; raises on a finding."""
    with open(src, "wb") as f:
        f.write(data)
    try:
        stats = torch_trace.convert(src, dst)
    except torch_trace.SnapshotError as e:
        msg = str(e)
        if not msg.startswith(src + ":"):
            raise AssertionError(f"SnapshotError does not name the file: {msg!r}")
        # Outcome class: the message without values (coverage proxy).
        return "err:" + msg[len(src) + 1:].split(":")[0][:40]
    opener = gzip.open if dst.endswith(".gz") else open
    with opener(dst, "rt", encoding="utf-8") as f:
        n = 0
        for ln in f:
            if ln.startswith("#"):
                if ln.startswith("#site") and len(ln.split("\t")) != 3:
                    raise AssertionError(f"bad site line {ln!r}")
                continue
            parts = ln.split()
            if len(parts) != 5 or parts[0] not in torch_trace.ACTIONS:
                raise AssertionError(f"bad trace line {ln!r}")
            n += 1
    if n != stats["lines"]:
        raise AssertionError(f"{n} lines written, stats say {stats['lines']}")
    return f"ok:{min(n, 8)}:{stats['skipped'] > 0}:{stats['dropped_frees'] > 0}"


def main(argv):
    seconds, seed, art = 10.0, 1, os.path.join(HERE, "..", "build-fuzz", "artifacts")
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--seed":
            seed = int(args.pop(0))
        elif a == "--artifacts":
            art = args.pop(0)
        else:
            seconds = float(a)
    rng = random.Random(seed)
    pool = seeds()
    keys = set()
    execs = new_units = 0
    t_end = time.monotonic() + seconds
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.pickle"), os.path.join(tmp, "out.trace")
        work = list(pool)
        while True:
            data = work[execs] if execs < len(work) and execs < len(pool) else mutate(rng, rng.choice(work), pool)
            try:
                key = run_one(data, src, dst)
            except Exception as e:  # noqa: BLE001 - every other exception is a finding
                os.makedirs(art, exist_ok=True)
                path = os.path.join(art, f"fuzz_pickle-crash-{seed}-{execs}.pickle")
                with open(path, "wb") as f:
                    f.write(data)
                print(f"fuzz_pickle: FINDING after {execs} executions: {type(e).__name__}: {e}\n"
                      f"  input: {path}", file=sys.stderr)
                return 1
            execs += 1
            if key not in keys:  # a new outcome: keep the input as a seed
                keys.add(key)
                new_units += 1
                if len(work) < 4096:
                    work.append(data)
            if time.monotonic() >= t_end:
                break
    print(f"Done {execs} runs in {seconds:.0f} second(s)")
    print(f"stat::number_of_executed_units: {execs}")
    print(f"stat::new_units_added: {new_units}")
    print(f"stat::outcome_classes: {len(keys)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
