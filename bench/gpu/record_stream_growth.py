#!/usr/bin/env python3
"""Reserved memory of a loop that frees every block with a record_stream (a
side stream reads each block, as a communication stream does): it must stay
near the working set. nofrag grew to the whole device before its pending
blocks were polled at allocation (session 18). One allocator per process:

    python3 bench/gpu/record_stream_growth.py native|nofrag [ITERS]

Prints one JSON line: reserved after the loop, its peak, and whether every
block read back its pattern.
"""
import json
import sys


def main():
    alloc = sys.argv[1]
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    if alloc == "nofrag":
        import nofrag.torch as nft
        info = nft.enable()
        if not info.get("adapter"):
            raise SystemExit(f"adapter not installed: {info.get('adapter_error')}")
    import torch
    side = torch.cuda.Stream()
    n = 4 << 20  # 4 MiB blocks
    sums = []
    for i in range(iters):
        x = torch.full((n // 4,), float(i % 97), device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            sums.append(x.sum())  # the side stream reads x after its free below
        x.record_stream(side)
        del x
    torch.cuda.synchronize()
    ok = all(int(s.item()) == (i % 97) * (n // 4) for i, s in enumerate(sums))
    st = torch.cuda.memory_stats()
    print(json.dumps({"alloc": alloc, "iters": iters, "block_mib": n >> 20,
                      "reserved_mib": torch.cuda.memory_reserved() >> 20,
                      "reserved_peak_mib": st.get("reserved_bytes.all.peak", 0) >> 20,
                      "pattern_ok": ok}))


if __name__ == "__main__":
    main()
