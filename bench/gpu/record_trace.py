"""Record an allocator trace on the GPU for the native model's check (issue 12,
"Also"): Llama-style 1.1B (bench/gpu/train.py's `llama`: hidden 2048, 16
layers, GQA 16/4, activation checkpointing), batch 4, sequence length drawn
from 256..2048 per micro-batch, gradient accumulation over 4 micro-batches,
AdamW, bf16 autocast, under PyTorch's native caching allocator with
`_record_memory_history(enabled="all", context=None)` from the first CUDA
allocation on.

    python3 bench/gpu/record_trace.py --out $OUT [--steps 3] [--dry-run]

Writes to --out:
  llama_accum4.trace.gz  the snapshot's device trace in nofrag's text format
                         (python -m nofrag.torch_trace; stdlib only)
  llama_accum4.json      what PyTorch reported: allocated/reserved peaks,
                         the segment count, steps, sequence lengths, losses
The CPU test (tests/test_models.c, test_recorded_llama_accum) replays the
trace through the native model and checks its segment peak against
reserved_bytes.all.peak within 1%.
--dry-run checks the arguments and the output folder and writes nothing that
could be read as a measurement.
"""
import argparse
import gzip
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

SEED = 4321
BATCH, SEQ, ACCUM = 4, (256, 2048), 4


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (each of %d micro-batches)" % ACCUM)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(SEED)
    lens = [[rng.randint(*SEQ) for _ in range(ACCUM)] for _ in range(a.steps)]
    if a.dry_run:
        print("DRY RUN: would record %d steps x %d micro-batches, sequence lengths %s into %s (nothing measured)"
              % (a.steps, ACCUM, lens, a.out))
        return 0
    import torch
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        print("record_trace: PYTORCH_CUDA_ALLOC_CONF is set; the native allocator's defaults are wanted", file=sys.stderr)
        return 2
    torch.manual_seed(SEED)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=3_000_000)
    from train import build  # bench/gpu/train.py's model builder
    model, vocab = build("llama", torch)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=False, foreach=True)
    gen = torch.Generator(device="cuda")
    losses = []
    t0 = time.time()
    for step in range(a.steps):
        for mb in range(ACCUM):
            gen.manual_seed(SEED * 1000 + step * ACCUM + mb)
            x = torch.randint(0, vocab, (BATCH, lens[step][mb]), device="cuda", generator=gen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss / ACCUM
            loss.backward()
            losses.append(float(loss.item()))
            del x, loss
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    ms = torch.cuda.memory_stats()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    pkl = os.path.join("/tmp", "llama_accum4.pickle")
    import pickle
    with open(pkl, "wb") as f:
        pickle.dump(snap, f)
    from nofrag import torch_trace
    out_trace = os.path.join(a.out, "llama_accum4.trace.gz")
    torch_trace.main([pkl, out_trace])
    info = {
        "workload": "Llama-style 1.1B, batch %d, seq %d..%d per micro-batch, grad accumulation %d, checkpointing"
                    % (BATCH, SEQ[0], SEQ[1], ACCUM),
        "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
        "steps": a.steps, "seq_lens": lens, "losses": losses, "wall_s": time.time() - t0,
        "allocated_bytes.all.peak": ms.get("allocated_bytes.all.peak"),
        "reserved_bytes.all.peak": ms.get("reserved_bytes.all.peak"),
        "segment_count_end": len(snap.get("segments", [])),
        "trace_entries": len(snap["device_traces"][0]) if snap.get("device_traces") else 0,
    }
    with open(os.path.join(a.out, "llama_accum4.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({k: v for k, v in info.items() if k not in ("losses", "seq_lens")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
