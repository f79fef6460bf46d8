#!/bin/sh
# Uncapped growth/placement policies tried for issue 13's "uncapped <= 1.02 at no more calls" target.
# Usage: uncapped_policies.sh NOFRAG_BINARY [TRACES_DIR], where the binary is built from commit 070c11f
# with uncapped-policies.patch applied (experiment-only NFX_* environment knobs, read with getenv on the
# hot path, so replay times are meaningless; without the patch every row is the plain default or tight:1):
#   git archive 070c11f | tar -x -C /tmp/exp && (cd /tmp/exp && patch -p1 < $OLDPWD/docs/results/issue13/uncapped-policies.patch
#     && cmake -S . -B build && cmake --build build -j2 --target nofrag_cli)
#   sh docs/results/issue13/uncapped_policies.sh /tmp/exp/build/nofrag
# Prints one markdown row per policy: physical / live and calls_second_half for vit, gpt2, llama1b_fsdp.
bin=$1; dir=${2:-../shared/traces}
row() { # row NAME CONF ENV...
  name=$1; conf=$2; shift 2
  out=""
  for t in vit gpt2 llama1b_fsdp; do
    r=$(env "$@" "$bin" replay "$dir/$t.trace.gz" --json --conf "$conf" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.4f %d %s" % (d["peak_physical_ratio"], d["calls_second_half"], d["status"]))')
    out="$out $r"
  done
  set -- $out
  echo "| $name | $1 / $4 / $7 | $2 / $5 / $8 |"
}
echo "| policy (uncapped) | physical / peak live (vit / gpt2 / llama) | calls_second_half |"
echo "| --- | --- | --- |"
row "default (tight:0)" tight:0 X=0
row "tight:1 (soft limit = live peak + 1/64 + 8 granules, first fit there)" tight:1 X=0
row "tight, slack 1/64, no fixed granules" tight:1 NFX_GRAN=0
row "tight, slack 1/64 + 32 granules" tight:1 NFX_GRAN=32
row "tight, slack 1/32 + 8 granules" tight:1 NFX_SHIFT=5
row "tight, slack 1/16 + 8 granules" tight:1 NFX_SHIFT=4
row "tight, cost-aware placement at the soft limit (no first fit)" tight:1 NFX_FF=0
row "tight, every free block scored at the soft limit (views, mapping, best fit)" tight:1 NFX_MIN=1
row "tight, first fit skipping blocks with conflicting views" tight:1 NFX_CONF=1
row "tight, first fit everywhere (not only at the soft limit)" tight:1 NFX_ALLFF=1
row "tight, address-ordered first fit everywhere" tight:1 NFX_AO=1
row "tight, best fit (address order) everywhere" tight:1 NFX_AO=2
row "tight, address-ordered fit with 1/8-class footprints at the soft limit" tight:1 NFX_AO=3
row "tight, moved granule: oldest freed" tight:1 NFX_KEY=1
row "tight, moved granule: newest freed of 1024 candidates" tight:1 NFX_CAND=1024
row "tight, moved granule: highest address of 1024" tight:1 NFX_KEY=2 NFX_CAND=1024
row "tight, requests >= 16 granules: best-covered window in the block" tight:1 NFX_WIN=16
row "tight, requests >= 256 granules: best-covered window in the block" tight:1 NFX_WIN=256
row "tight, blocks >= 256 MiB in their own address range" tight:1 NFX_HUGE=256
row "tight, each conflict raises the soft limit by a granule (grow on conflict)" tight:1 NFX_GROW=1
row "no views, first fit everywhere (virtual granules touched)" tight:0 NFX_ALLFF=1
row "no views, address-ordered first fit (virtual granules touched)" tight:0 NFX_AO=1
row "no views, best fit (virtual granules touched)" tight:0 NFX_AO=2
