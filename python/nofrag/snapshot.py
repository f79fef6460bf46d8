"""Convert a PyTorch memory snapshot to nofrag's text trace format.

    python3 -m nofrag.snapshot snapshot.pickle[.gz] out.trace[.gz] [--device N]

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
"""

import gzip
import os
import pickle
import sys

__all__ = ["SnapshotError", "load", "convert", "iter_lines", "main"]

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
    traces = snapshot["device_traces"]
    if not 0 <= device < len(traces):
        raise SnapshotError(f"{path}: no device {device} (snapshot has {len(traces)})")
    st = {"lines": 0, "skipped": 0, "dropped_frees": 0}
    live, segs = set(), set()
    for i, e in enumerate(traces[device]):
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
    with opener(tmp, "wt", encoding="utf-8") as f:  # file names in #site lines may be non-ASCII
        f.write(f"# converted by nofrag.snapshot from {os.path.basename(src)}, device {device}\n")
        f.write("# ACTION ADDR SIZE STREAM TIME_US\n")
        if stats["skipped"] or stats["dropped_frees"]:
            f.write(f"# skipped {stats['skipped']} marker/segment_map entries; dropped "
                    f"{stats['dropped_frees']} frees of blocks allocated before the trace began\n")
        for ln in lines:
            f.write(ln)
            f.write("\n")
    os.replace(tmp, dst)  # no half-written trace left behind on error
    return stats


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    device = 0
    if "--device" in argv:
        k = argv.index("--device")
        try:
            device = int(argv[k + 1])
        except (IndexError, ValueError):
            print("nofrag.snapshot: --device needs an integer", file=sys.stderr)
            return 2
        del argv[k:k + 2]
    if len(argv) != 2 or argv[0].startswith("-"):
        print("usage: python3 -m nofrag.snapshot SNAPSHOT.pickle[.gz] OUT.trace[.gz] [--device N]",
              file=sys.stderr)
        return 2
    try:
        st = convert(argv[0], argv[1], device)
    except (SnapshotError, OSError) as e:
        print(f"nofrag.snapshot: {e}", file=sys.stderr)
        return 2
    print(f"nofrag.snapshot: {argv[1]}: {st['lines']} events ({st['skipped']} skipped, "
          f"{st['dropped_frees']} frees before the trace began dropped)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
