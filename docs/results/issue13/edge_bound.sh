#!/bin/sh
# Upper bound of what edge sharing (issue 13) could save at each shared trace's
# peak live moment, at its minimum capacity: the pool's snapshot there (a copy
# of src/replay/replay.c that exposes the pool to the sample hook, which the
# library's replay does not allow), then edge_bound.py. Run from the repository
# root after a build (./build/libnofrag.a). Writes /tmp/edge_bound/.
set -e
d=/tmp/edge_bound; mkdir -p $d
sed -e 's/#include "replay.h"/#include "replay.h"\nnf_pool_t *nfx_pool;/' \
    -e 's/st = nf_pool_create(&pool, be, &cfg);/st = nf_pool_create(\&pool, be, \&cfg); nfx_pool = pool;/' \
    src/replay/replay.c > $d/replay_exposed.c
gcc -O2 -Iinclude -Isrc -Isrc/replay docs/results/issue13/edge_bound.c $d/replay_exposed.c src/replay/trace.c \
    src/replay/trace_rmm.c build/libnofrag.a -lz -lm -lpthread -ldl -o $d/edge_bound
for tg in "vit 4871" "gpt2 11898" "llama1b_fsdp 8333"; do
  set -- $tg
  echo "== $1 at its minimum capacity ($2 granules)"
  $d/edge_bound ../shared/traces/$1.trace.gz limit:$(($2 * 2097152)) $d/$1.json
  python3 docs/results/issue13/edge_bound.py $d/$1.json
done
