#!/bin/sh
# The replay on the GPU (nofrag replay --device cuda:0) against the replay on
# the simulated device, for each trace given (default: data/*.trace.gz):
#   1. the CPU bisection's minimum capacity;
#   2. at that limit, on the GPU with --verify: it must complete, verify every
#      block through device memory, and make exactly the CPU replay's calls,
#      moves and evictions (the same decisions);
#   3. the same at 1.01 x peak live.
# Exit 0 pass, 1 fail, 77 no GPU (skip). Run from the repository root after a
# build: sh tests/gpu/replay_device.sh [./build/nofrag] [TRACE...]
# (NF_RD_DEVICE='' runs the "GPU" side on the simulated device too: a dry run
# of this script on a machine without one.)
set -u
cli=${1:-./build/nofrag}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- data/*.trace.gz
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 77; }
dev=${NF_RD_DEVICE---device cuda:0}
if [ -n "$dev" ] && ! "$cli" replay "$1" $dev --limit 1TiB >/dev/null 2>/tmp/nf_rd_err.$$; then
  if grep -q "no NVIDIA driver\|cuInit\|no CUDA-capable" /tmp/nf_rd_err.$$; then
    echo "SKIP: $(cat /tmp/nf_rd_err.$$)"; rm -f /tmp/nf_rd_err.$$; exit 77
  fi
fi
rm -f /tmp/nf_rd_err.$$
fail=0
for t in "$@"; do
  cpu=$(NOFRAG_QUIET_OOM=1 "$cli" replay "$t" --min-capacity --json) || { echo "FAIL $t: CPU bisection"; fail=1; continue; }
  lims=$(echo "$cpu" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["min_capacity"], int(d["trace_peak_live"]*1.01))')
  min=${lims% *} l101=${lims#* }
  for lim in "$min" "$l101"; do
    c=$("$cli" replay "$t" --limit "$lim" --json)
    g=$("$cli" replay "$t" --limit "$lim" --json $dev --verify)
    if ! printf '%s\n%s\n' "$c" "$g" | python3 -c '
import json, sys
c, g = (json.loads(l) for l in sys.stdin.read().splitlines())
keys = ("backend_calls", "calls_second_half", "view_moves", "view_evictions", "edges_made", "peak_physical")
bad = [k for k in keys if c[k] != g[k]]
ok = g["status"] == "ok" and g["verified"] == g["allocs"] and g["pool_check"] == "ok" and not bad
print(("PASS" if ok else "FAIL"), sys.argv[1], "limit", sys.argv[2], "status", g["status"], "verified", g["verified"],
      "of", g["allocs"], "calls", g["backend_calls"], "edges", g["edges_made"], "gpu s %.3f cpu s %.3f" % (g["replay_seconds"], c["replay_seconds"]),
      ("differs: " + " ".join("%s %s/%s" % (k, c[k], g[k]) for k in bad)) if bad else "", g["error"] or "")
sys.exit(0 if ok else 1)' "$t" "$lim"; then fail=1; fi
  done
done
exit $fail
