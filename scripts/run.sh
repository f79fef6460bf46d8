#!/usr/bin/env bash
# Main job: replay the GPT-2 allocation trace and find the smallest pool
# capacity it fits in, for nofrag and for models of PyTorch's allocator. Builds the CLI quietly first (log shown on failure).
# Extra arguments go to `nofrag replay`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-deps.sh --build >&2 # stdout is the replay's: --json must stay one JSON object
. scripts/build-dir.sh
fresh_build_dir build # a copied checkout's build/ belongs to the original tree
mkdir -p build
log=build/run-build.log
{
  # Configure only once; afterwards `cmake --build` re-runs configuration by
  # itself when needed, and we do not override options chosen by the user.
  if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
  fi
  cmake --build build -j"$(nproc)" --target nofrag_cli
} >"$log" 2>&1 || { cat "$log" >&2; echo "run.sh: build failed (log: $log)" >&2; exit 1; }

# "Does it fit where PyTorch does not?" asked like for like: the smallest cap
# (min capacity) each allocator completes the trace under, nofrag next to
# models of PyTorch's allocator with default settings and with
# expandable_segments:True. (An uncapped run's reserved bytes are a different
# measure: an allocator may hold more when nothing asks it to give back.)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
./build/nofrag replay data/gpt2.trace.gz --allocator all --min-capacity "$@" | tee "$out" || rc=$?
for a in "$@"; do [ "$a" = --json ] && exit "$rc"; done # JSON stays one object, nothing after it

# The answer, from the table just printed (absent with --json or one allocator).
awk '$1 == "nofrag" && NF == 8 { n = $5; nr = $6 } $1 == "native" && NF == 8 { p = $5; pr = $6 }
     $1 == "expandable" && NF == 8 { e = $5; er = $6 }
     END {
       if (n == "" || p == "" || e == "" || n == "-" || p == "-" || e == "-") exit
       printf "\nanswer: the smallest cap each completes under (min capacity / peak live):\n"
       printf "  nofrag %.4f x, PyTorch native %.4f x, PyTorch expandable_segments %.4f x\n", nr, pr, er
       printf "  under nofrag'"'"'s cap (%.3f GiB) the trace fits with nofrag; PyTorch native needs %.1f%% more, " \
              "expandable %.2f%% more\n", n / 2^30, 100 * (p / n - 1), 100 * (e / n - 1)
     }' "$out"
cat <<'EOF_TERMS'

terms:
  peak live        most bytes the trace holds allocated at once: the floor no allocator can go below
  min capacity     smallest memory cap (whole granules, 2 MiB unless --granule) under which the whole trace completes; cap/live
                   divides it by peak live. The like-for-like column: "does it fit" under a given cap
  peak reserved    memory held in a run without a cap (nofrag: physical granules; models: PyTorch's
                   reserved bytes); res/live divides it by peak live. Not a cap: nothing asked to give back
  backend calls    calls nofrag made into the (here simulated) driver: create, map, unmap, release of
                   physical granules, address-range reservations, events
  time in them     how long those calls took, largest kinds first (here memfd and mmap work; with
                   --device cuda:0 on a GPU, the driver's; nf_stats_t.call_ns in a program)
  in 2nd half      the backend calls made during the trace's second half: steady state, once warm
  reclaims         times nofrag freed cached granules and remapped them to serve a request the cap would
                   otherwise refuse; "granules stitched" counts the granules those moved
  views            at a cap, a granule moved to serve a request stays mapped where it was (a parked
                   view); a later block there takes it back with no backend call (docs/design.md)
  device calls     nofrag: its backend calls (as above); the models: cudaMalloc + cudaFree (native), or map
                   + unmap operations (expandable: one operation covers a run of pages, and PyTorch makes a
                   create and a map, or an unmap and a release, per page): not the same unit as nofrag's
EOF_TERMS
exit "$rc"
