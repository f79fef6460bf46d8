#!/usr/bin/env bash
# Async access on the GPU in one call (docs/benchmarks.md, "Async access"):
# what the driver allows (bench/gpu/async_map.c), test_cuda (views and async
# views on the device), then llama (and the models named in NOFRAG_ASYNC_MODELS,
# default "llama"): uncapped native, nofrag, nofrag-tight-async
# (ALLOCS), then nofrag and nofrag-async at 1.01 x live; ROUNDS rounds (default
# 2), each with its own native run, paired step by step.
#   OUT=/tmp/x bash bench/gpu/run_async.sh
set -u
T0=$(date +%s)
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench-out}
mkdir -p "$OUT"
BUDGET=${NOFRAG_BENCH_BUDGET:-560}
exec > >(tee -a "$OUT/run.log") 2>&1
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "== [$(elapsed)s] $*"; }
. bench/gpu/build.sh
say "build"
nf_build_lib || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
export NOFRAG_LIB="$ROOT/build/libnofrag.so" PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
say "async_map (what a mapping thread costs the launching thread)"
if gcc -std=c11 -O2 -D_GNU_SOURCE -I/usr/local/cuda/include bench/gpu/async_map.c -L/usr/local/cuda/lib64/stubs \
     -lcuda -lpthread -o build/async_map >>"$OUT/build.log" 2>&1; then
  for i in 1 2; do timeout 60 ./build/async_map >"$OUT/async_map_$i.json"; echo "rc=$?"; cat "$OUT/async_map_$i.json"; done
else
  echo "async_map did not compile"; tail -5 "$OUT/build.log"
fi
say "test_cuda"
nf_test_cuda
for m in ${NOFRAG_ASYNC_MODELS:-llama}; do
  for r in $(seq 1 "${ROUNDS:-2}"); do
    left=$(( BUDGET - $(elapsed) - 10 ))
    [ "$left" -lt 60 ] && { say "no time left for $m round $r"; break; }
    say "$m round $r (budget ${left}s)"
    timeout "$left" python3 bench/gpu/train.py --out "$OUT/$m-r$r" --budget "$left" --models "$m" \
      --allocs "${ALLOCS:-native,nofrag,nofrag-tight-async}" --caps 1.01 \
      --capped-allocs nofrag,nofrag-async --bisect '' --no-limits
    tail -12 "$OUT/$m-r$r/results.md" 2>/dev/null
  done
done
say "done"
nf_pack_out run.log test_cuda.log async_map_1.json async_map_2.json
