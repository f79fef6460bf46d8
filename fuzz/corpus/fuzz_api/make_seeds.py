#!/usr/bin/env python3
"""Seeds for fuzz/fuzz_api.c that reach the stream-slot code: more than 64
streams holding live blocks (recycling, slots taken, orphans re-homed by free,
offload and prefetch, record_stream refused). Random inputs seldom name 65
distinct streams, so libFuzzer would not get there from an empty corpus.
Writes seed_*.bin beside this file; `.ci/run` copies them into each run's corpus.

An operation is 4 bytes: op (% 10), b (slot = b % 96; stream bits 0-2 = b >> 5),
then a 16-bit argument whose high byte's low 4 bits are stream bits 3-6."""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))


def alloc_new_stream(slot, streams_used, arg_lo):
    """An alloc (small) into `slot` (0..95) naming a stream (1..127) not used yet."""
    for b in (slot, slot + 96, slot + 192):
        if b >= 256:
            continue
        for h in range(16):
            t = (b >> 5) | h << 3
            if t and t not in streams_used:
                streams_used.add(t)
                return bytes([0, b, arg_lo, h]), t
    raise ValueError("no stream left")


def op_on(kind, slot, stream, arg_lo=0x40, arg_hi_bits=0):
    """An op on `slot` (0..95) naming `stream` where the slot byte allows it (else another stream)."""
    for b in (slot, slot + 96, slot + 192):
        if b < 256 and b >> 5 == stream & 7:
            return bytes([kind, b, arg_lo, ((stream >> 3) & 15) | arg_hi_bits << 4])
    return bytes([kind, slot, arg_lo, ((stream >> 3) & 15) | arg_hi_bits << 4])


def seed(n_streams, rng, tail):
    out, used, slots = bytearray(), set(), []
    for s in range(n_streams):  # one small live block per stream, each in its own slot
        o, t = alloc_new_stream(s, used, rng.randrange(256))
        out += o
        slots.append((s, t))
    for _ in range(tail):  # then frees, re-allocations on other streams, offloads, prefetches, record_streams
        s, t = rng.choice(slots)
        k = rng.choice([3, 4, 0, 1, 6, 8, 9, 6, 8, 9])
        out += op_on(k, s, rng.randrange(128), rng.randrange(256), rng.randrange(16))
    return bytes(out)


def main():
    rng = random.Random(13)
    # A trailing configuration byte (the length is then not a multiple of 4): 1 units,
    # 2 tight, 4 views off, 8 no release decay.
    for name, n, tail, conf in (("seed_70", 70, 40, None), ("seed_96", 96, 120, None),
                                ("seed_90_mixed", 90, 300, None), ("seed_96_units", 96, 120, 1 | 8),
                                ("seed_90_tight", 90, 300, 2), ("seed_70_noviews", 70, 40, 4)):
        with open(os.path.join(HERE, name + ".bin"), "wb") as f:
            f.write(seed(n, rng, tail) + (bytes([conf]) if conf is not None else b""))


if __name__ == "__main__":
    main()
