"""PyTorch memory snapshots: convert one to nofrag's text trace format, and
export a nofrag pool snapshot in PyTorch's format.

    python3 -m nofrag.torch_trace snapshot.pickle[.gz] out.trace[.gz] [--device N]

`torch.cuda.memory._dump_snapshot` writes a pickle of plain dicts and lists
(no torch objects), so the standard library reads it without torch. Each entry
of ``device_traces[N]`` becomes one line ``ACTION ADDR SIZE STREAM TIME_US``
(see ../shared/traces/README.md); the output is gzip-compressed when its name
ends in ``.gz``.

What is not a line of our format:
- ``snapshot`` and ``oom`` entries are markers, not allocator calls: skipped.
- ``segment_map`` / ``segment_unmap`` (expandable segments) map part of a
  segment, so they cannot be checked as native segments: skipped, counted.
- PyTorch keeps only the last ``max_entries`` trace entries (a ring buffer),
  so a snapshot may begin mid-run: frees of blocks (and segments) allocated
  before the first entry are dropped and counted in a ``#`` comment, since
  the replay could not know their sizes otherwise.
Anything else malformed raises SnapshotError naming the entry index.

Call sites: an ``alloc`` entry with a Python stack (``frames``, innermost
first) is followed by a comment line ``#site<TAB>FILE:LINE<TAB>FUNCTION``: the
first frame outside torch's own modules (else the innermost frame), the path
shortened after ``site-packages/``. Old readers skip it as a comment; the CLI
reads it for ``--hotspots`` (docs/replay.md).

The other way: ``snapshot_to_torch`` / ``export_torch_snapshot`` turn a
nofrag pool snapshot (``nofrag.snapshot()``'s dict) into what
``torch.cuda.memory._snapshot()`` returns, so PyTorch's own
``torch.cuda._memory_viz`` tools read it (docs/pytorch.md).
"""

import gzip
import os
import pickle
import sys

__all__ = ["SnapshotError", "load", "convert", "iter_lines", "main", "snapshot_to_torch", "export_torch_snapshot"]

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free")
SKIPPED = ("snapshot", "oom", "segment_map", "segment_unmap")


class SnapshotError(ValueError):
    """A snapshot that cannot be converted (message names file and entry)."""


class _PlainUnpickler(pickle.Unpickler):
    # A snapshot holds only builtins; refusing globals means a hostile pickle
    # cannot run code through __reduce__ (pickle's usual hazard).
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global '{module}.{name}' not allowed in a memory snapshot")


def load(path):
    """Read a snapshot (gzip-compressed or not) and return its dict."""
    with open(path, "rb") as f:
        magic = f.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    try:
        with opener(path, "rb") as f:
            data = _PlainUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError) as e:
        raise SnapshotError(f"{path}: not a readable snapshot pickle: {e}") from e
    except MemoryError as e:  # a corrupt length field: the unpickler sized a buffer from it
        raise SnapshotError(f"{path}: not a readable snapshot pickle: a length field asks for more memory "
                            "than there is (corrupt file?)") from e
    except Exception as e:  # noqa: BLE001 - pickle documents arbitrary exceptions for malformed
        # input (OverflowError for a FRAME length, IndexError, KeyError, RecursionError...)
        raise SnapshotError(f"{path}: not a readable snapshot pickle: {type(e).__name__}: {e}") from e
    if isinstance(data, list):  # very old snapshots were a bare segment list
        raise SnapshotError(f"{path}: snapshot has no device_traces (recorded without _record_memory_history?)")
    if not isinstance(data, dict) or not isinstance(data.get("device_traces"), list):
        raise SnapshotError(f"{path}: not a memory snapshot (no 'device_traces' list)")
    return data


def _uint(path, i, entry, key):
    v = entry.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 64:
        raise SnapshotError(f"{path}: device_traces entry {i}: '{key}' is not an unsigned 64-bit integer: {v!r}")
    return v


SITE_MAX = 400  # a site line stays far below the trace format's 4096-byte line limit


def site_of(frames):
    """'FILE:LINE' and function of the allocation's call site, or None: the
    first frame not inside torch (whose frames are the same few wrappers for
    every tensor: module.py, functional.py, autograd), else the innermost."""
    if not isinstance(frames, list):
        return None
    good = [f for f in frames if isinstance(f, dict) and isinstance(f.get("filename"), str)
            and isinstance(f.get("line"), int) and not isinstance(f.get("line"), bool)]
    if not good:
        return None
    pick = next((f for f in good if "/torch/" not in f["filename"].replace("\\", "/")
                 and not f["filename"].startswith("torch/")), good[0])
    fn = pick["filename"]
    k = fn.rfind("site-packages/")
    if k >= 0:
        fn = fn[k + len("site-packages/"):]
    name = pick.get("name") if isinstance(pick.get("name"), str) else "?"
    clean = lambda x: "".join(c if c.isprintable() and c != "\t" else " " for c in x)  # noqa: E731
    site = clean(fn)[-SITE_MAX:] + f":{pick['line']}"
    return site, clean(name)[:SITE_MAX]


def iter_lines(snapshot, device=0, path="<snapshot>", stats=None, sites=False):
    """Yield trace lines (without newline) for one device's trace entries.
    `stats`, if a dict, receives counts of converted, skipped and dropped
    entries. With `sites`, each alloc with a stack is followed by its
    '#site' comment line (not counted in stats)."""
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    if not isinstance(traces, list):
        raise SnapshotError(f"{path}: not a memory snapshot (no 'device_traces' list)")
    if isinstance(device, bool) or not isinstance(device, int):
        raise SnapshotError(f"{path}: device must be an integer, not {device!r}")
    if not 0 <= device < len(traces):
        raise SnapshotError(f"{path}: no device {device} (snapshot has {len(traces)})")
    entries = traces[device]
    if not isinstance(entries, list):
        raise SnapshotError(f"{path}: device_traces[{device}] is not a list: {type(entries).__name__}")
    st = {"lines": 0, "skipped": 0, "dropped_frees": 0}
    live, segs = set(), set()
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise SnapshotError(f"{path}: device_traces entry {i}: not a dict")
        action = e.get("action")
        if action in SKIPPED:
            st["skipped"] += 1
            continue
        if action not in ACTIONS:
            raise SnapshotError(f"{path}: device_traces entry {i}: unknown action {action!r}")
        addr, size = _uint(path, i, e, "addr"), _uint(path, i, e, "size")
        stream = _uint(path, i, e, "stream")
        t = _uint(path, i, e, "time_us") if "time_us" in e else 0  # absent before PyTorch 2.1
        if action == "alloc":
            live.add(addr)
        elif action == "segment_alloc":
            segs.add(addr)
        elif action == "segment_free":
            if addr not in segs:
                st["dropped_frees"] += 1
                continue
            segs.discard(addr)
        elif addr not in live:  # free_* of a block allocated before the ring buffer's start
            st["dropped_frees"] += 1
            continue
        elif action == "free_completed":
            live.discard(addr)
        st["lines"] += 1
        yield f"{action} {addr} {size} {stream} {t}"
        if sites and action == "alloc":
            site = site_of(e.get("frames"))
            if site:
                yield f"#site\t{site[0]}\t{site[1]}"
    if stats is not None:
        stats.update(st)


def convert(src, dst, device=0):
    """Convert snapshot file `src` to trace file `dst`; returns the stats dict."""
    snap = load(src)
    stats = {}
    lines = list(iter_lines(snap, device, src, stats, sites=True))
    opener = gzip.open if dst.endswith(".gz") else open
    tmp = dst + ".tmp"
    try:
        try:
            f = opener(tmp, "wt", encoding="utf-8")  # file names in #site lines may be non-ASCII
        except OSError as e:  # name the file asked for, not the temporary beside it
            raise OSError(e.errno, f"cannot write {dst}: {e.strerror}") from None
        with f:
            f.write(f"# converted by nofrag.torch_trace from {os.path.basename(src)}, device {device}\n")
            f.write("# ACTION ADDR SIZE STREAM TIME_US\n")
            if stats["skipped"] or stats["dropped_frees"]:
                f.write(f"# skipped {stats['skipped']} marker/segment_map entries; dropped "
                        f"{stats['dropped_frees']} frees of blocks allocated before the trace began\n")
            for ln in lines:
                f.write(ln)
                f.write("\n")
        os.replace(tmp, dst)  # no half-written trace left behind on error
    finally:
        if os.path.exists(tmp):  # writing failed partway (disk full...): no dst.tmp left either
            os.unlink(tmp)
    return stats


# ------------------------------------------------------------------ export

_STATES = {"live": "active_allocated", "pending": "active_pending_free"}
_TRACE_KEYS = ("addr", "size", "stream")


def _int(v):
    """An integer from nf_snapshot's JSON: addresses and stream handles are
    "0x..." strings there, sizes are numbers."""
    if isinstance(v, str):
        return int(v, 0)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"not an integer: {v!r}")
    return v


def _runs(chunk, granule):
    """Maximal mapped address ranges [start, end) of a chunk: nf_snapshot
    splits runs by tier and readiness; PyTorch's segments only need mapped."""
    out = []
    for r in sorted(chunk.get("mapped", ()), key=lambda r: _int(r["addr"])):
        a = _int(r["addr"])
        e = a + _int(r["count"]) * granule
        if out and out[-1][1] == a:
            out[-1][1] = e
        else:
            out.append([a, e])
    return out


def _segment(chunk, start, end, device):
    blocks, pos, stream = [], start, None
    for b in sorted(chunk.get("blocks", ()), key=lambda b: _int(b["addr"])):
        a = _int(b["addr"])
        lo, hi = max(a, start), min(a + _int(b["size"]), end)
        if lo >= hi:
            continue
        if lo > pos:  # not covered by any block (nofrag's blocks tile a chunk, so not expected)
            blocks.append({"address": pos, "size": lo - pos, "requested_size": 0, "state": "inactive", "frames": []})
        state = _STATES.get(b.get("state"), "inactive")
        req = min(_int(b.get("requested", 0)), hi - lo) if state != "inactive" else 0
        if state != "inactive" and stream is None and "stream" in b:
            stream = _int(b["stream"])
        blocks.append({"address": lo, "size": hi - lo, "requested_size": req, "state": state, "frames": []})
        pos = hi
    if pos < end:
        blocks.append({"address": pos, "size": end - pos, "requested_size": 0, "state": "inactive", "frames": []})
    active = [b for b in blocks if b["state"] != "inactive"]
    return {
        "device": device,
        "address": start,
        "total_size": end - start,
        "allocated_size": sum(b["size"] for b in active if b["state"] == "active_allocated"),
        "active_size": sum(b["size"] for b in active),
        "requested_size": sum(b["requested_size"] for b in active),
        "stream": stream or 0,
        "segment_type": "small" if chunk.get("arena") == "small" else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": True,
        "frames": [],
        "blocks": blocks,
    }


def _trace_entry(e):
    out = {"action": e["action"], "time_us": _int(e.get("time_us", 0)), "frames": list(e.get("frames", []))}
    for k in _TRACE_KEYS:
        out[k] = _int(e.get(k, 0))
    return out


def trace_from_rmm(path):
    """Trace entries (PyTorch's device_traces vocabulary) from a log in RMM's
    CSV format, e.g. one a pool recorded with the config key trace:PATH. An
    'allocate' row becomes an 'alloc' entry, a 'free' row 'free_requested' and
    'free_completed' (nofrag frees at once; cross-stream reuse is ordered by
    events, not delayed). Time HH:MM:SS:micro becomes microseconds of the day."""
    import csv
    entries = []
    with open(path, newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header != ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]:
            raise ValueError(f"{path}: not an RMM CSV log (header {header!r})")
        for n, row in enumerate(rows, start=2):
            if len(row) != 6:
                raise ValueError(f"{path}:{n}: expected 6 fields, got {len(row)}")
            _, time, action, ptr, size, stream = row
            try:
                h, m, sec, us = (int(x) for x in time.split(":"))
                t = ((h * 60 + m) * 60 + sec) * 1000000 + us
                e = {"addr": int(ptr, 16), "size": int(size), "stream": int(stream, 0), "time_us": t}
            except ValueError as err:
                raise ValueError(f"{path}:{n}: {err}") from None
            if action == "allocate":
                entries.append(dict(e, action="alloc"))
            elif action == "free":
                entries += [dict(e, action="free_requested"), dict(e, action="free_completed")]
            elif action != "allocate failure":
                raise ValueError(f"{path}:{n}: unknown action {action!r}")
    return entries


def snapshot_to_torch(snap, device=None, trace=None):
    """A nofrag pool snapshot (the dict from nofrag.snapshot()) as the dict
    ``torch.cuda.memory._snapshot()`` returns.

    Each maximal mapped address range of a chunk becomes one segment
    (``is_expandable``: nofrag maps and unmaps granules inside its chunks as
    PyTorch's expandable segments do); its blocks are nofrag's blocks clipped
    to the range, so they tile the segment in address order (live ->
    'active_allocated', pending a record_stream -> 'active_pending_free',
    free -> 'inactive'). Sums: allocated_size over all segments equals the
    pool's live_rounded, total_size its mapped bytes. No stacks: every
    'frames' is empty. A segment's 'stream' is that of its first live block
    (0 if none): nofrag's chunks are not per stream.

    ``device`` (each segment's "device"): by default the pool's own, from the
    snapshot's "device" (0 in snapshots without one); a device 1 pool was
    exported as device 0's.

    ``device_traces`` has ``device + 1`` lists, empty unless trace entries are
    given (``trace``, or a "trace" list in the snapshot): dicts with
    action/addr/size/stream/time_us in PyTorch's trace-entry vocabulary
    (alloc, free_requested, free_completed, segment_alloc, ...)."""
    if not isinstance(snap, dict) or not isinstance(snap.get("chunks"), list) or "totals" not in snap:
        raise ValueError("snapshot_to_torch: not a nofrag pool snapshot (no 'chunks' / 'totals')")
    if device is None:
        device = snap.get("device", 0)
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"snapshot_to_torch: bad device {device!r}")
    totals = snap["totals"]
    granule = _int(totals["granule"])
    segments = []
    for c in sorted(snap["chunks"], key=lambda c: _int(c["base"])):
        for start, end in _runs(c, granule):
            segments.append(_segment(c, start, end, device))
    traces = [[] for _ in range(device + 1)]
    entries = trace if trace is not None else snap.get("trace") or []
    traces[device] = [_trace_entry(e) for e in entries]
    settings = {
        "PYTORCH_CUDA_ALLOC_CONF": "",
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": True,
        "roundup_power2_divisions": {},
        "nofrag": {k: totals[k] for k in sorted(totals)},
    }
    return {"segments": segments, "device_traces": traces, "allocator_settings": settings}


def export_torch_snapshot(snap, path, device=None, trace=None):
    """Write snapshot_to_torch(snap, device, trace) to `path` as a pickle
    (protocol 4; gzip-compressed when the name ends in .gz), the format
    ``torch.cuda.memory._dump_snapshot`` writes. Returns the dict."""
    data = snapshot_to_torch(snap, device, trace)
    opener = gzip.open if str(path).endswith(".gz") else open
    tmp = f"{path}.tmp"
    try:
        try:
            f = opener(tmp, "wb")
        except OSError as e:  # name the file asked for, not the temporary beside it
            raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from None
        with f:
            pickle.dump(data, f, protocol=4)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return data


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python3 -m nofrag.torch_trace SNAPSHOT.pickle[.gz] OUT.trace[.gz] [--device N]"
    if any(a in ("-h", "--help") for a in argv):
        print(usage)
        return 0
    device = 0
    if "--device" in argv:
        k = argv.index("--device")
        try:
            device = int(argv[k + 1])
        except (IndexError, ValueError):
            print("nofrag.torch_trace: --device needs an integer", file=sys.stderr)
            return 2
        del argv[k:k + 2]
    if len(argv) != 2 or argv[0].startswith("-"):
        print(usage, file=sys.stderr)
        return 2
    try:
        st = convert(argv[0], argv[1], device)
    except (SnapshotError, OSError) as e:
        print(f"nofrag.torch_trace: {e}", file=sys.stderr)
        return 2
    print(f"nofrag.torch_trace: {argv[1]}: {st['lines']} events ({st['skipped']} skipped, "
          f"{st['dropped_frees']} frees before the trace began dropped)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
