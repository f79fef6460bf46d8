#!/bin/sh
# The replay on the GPU (nofrag replay --device cuda:0) against the replay on
# the simulated device, for each trace given (default: data/*.trace.gz):
#   1. the CPU bisection's minimum capacity;
#   2. at that limit, on both devices with --verify: both must complete, the
#      GPU side verify every block the CPU side does (through device memory),
#      and make exactly the CPU replay's calls, moves and evictions (the same
#      decisions: both run under the same limit, so under the same policy);
#   3. the same at 1.01 x peak live, or at the minimum where that is higher.
# Exit 0 pass, 1 fail, 77 no GPU or no python3 (skip). Run from the repository
# root after a build: sh tests/gpu/replay_device.sh [./build/nofrag] [TRACE...]
# (NF_RD_DEVICE='' runs the "GPU" side on the simulated device too: a dry run
# of this script on a machine without one. CTest also runs it with the
# stand-in driver of tests/fake_cuda/fake_cuda.c on LD_LIBRARY_PATH.)
set -u
cli=${1:-./build/nofrag}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- data/*.trace.gz
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 77; }
dev=${NF_RD_DEVICE---device cuda:0}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
if [ -n "$dev" ]; then # a driver? (a one-allocation trace)
  printf 'alloc 4096 4096 0 1\n' >"$tmp/one.trace"
  if ! "$cli" replay "$tmp/one.trace" $dev >/dev/null 2>"$tmp/err"; then
    if grep -qE 'no NVIDIA driver|cuInit|no CUDA-capable' "$tmp/err"; then echo "SKIP: $(cat "$tmp/err")"; exit 77; fi
    echo "FAIL: $(cat "$tmp/err")"; exit 1
  fi
fi
fail=0
for t in "$@"; do
  cpu=$(NOFRAG_QUIET_OOM=1 "$cli" replay "$t" --min-capacity --json) || { echo "FAIL $t: CPU bisection"; fail=1; continue; }
  lims=$(echo "$cpu" | python3 -c 'import json,sys; d=json.load(sys.stdin); m=d["min_capacity"]; print(m, max(m, int(d["trace_peak_live"]*1.01)))')
  min=${lims% *} l101=${lims#* }
  for lim in "$min" "$l101"; do
    c=$("$cli" replay "$t" --limit "$lim" --json --verify)
    g=$("$cli" replay "$t" --limit "$lim" --json $dev --verify)
    if ! printf '%s\n%s\n' "$c" "$g" | python3 -c '
import json, sys
c, g = (json.loads(l) for l in sys.stdin.read().splitlines())
keys = ("backend_calls", "calls_second_half", "view_moves", "view_evictions", "edges_made", "peak_physical", "verified")
bad = [k for k in keys if c[k] != g[k]]
ok = c["status"] == "ok" and g["status"] == "ok" and g["verified"] > 0 and g["pool_check"] == "ok" and not bad
print(("PASS" if ok else "FAIL"), sys.argv[1], "limit", sys.argv[2], "status", c["status"], "/", g["status"], "verified",
      g["verified"], "calls", g["backend_calls"], "edges", g["edges_made"], "gpu s %.3f cpu s %.3f" % (g["replay_seconds"],
      c["replay_seconds"]), ("differs: " + " ".join("%s %s/%s" % (k, c[k], g[k]) for k in bad)) if bad else "",
      g["error"] or c["error"] or "")
sys.exit(0 if ok else 1)' "$t" "$lim"; then fail=1; fi
  done
done
exit $fail
