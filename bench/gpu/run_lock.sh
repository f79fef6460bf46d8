#!/usr/bin/env bash
# The biased pool lock on the GPU machine, in one call (about 8 minutes):
#   - the cached alloc+free pair against glibc on its CPU (Intel Xeon), with and
#     without the bias (NOFRAG_NO_LOCK_BIAS=1), three runs each, one pinned core;
#   - threads taking turns in phases of 1 to 65,536 pairs (bench_lock), both ways;
#   - the CUDA test (tests/gpu) and the PyTorch plug-in's feature cases
#     (bench/gpu/run_torch.sh, budget NOFRAG_BENCH_BUDGET, default 300 s), which
#     run the library from PyTorch's main and autograd threads.
# From the repository root: OUT=... bash bench/gpu/run_lock.sh
set -u
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench-out}
mkdir -p "$OUT"
export OUT
. bench/gpu/build.sh
nf_build_lib || { tail -30 "$OUT/build.log"; exit 1; }
{ lscpu | head -16; uname -r; } >"$OUT/cpu.txt" 2>&1
grep -E "Model name|^CPU\(s\)|Hypervisor" "$OUT/cpu.txt"
for r in 1 2 3; do
  taskset -c 3 build/bench_alloc 200000 >"$OUT/ba-bias-$r.txt" 2>&1
  NOFRAG_NO_LOCK_BIAS=1 taskset -c 3 build/bench_alloc 200000 >"$OUT/ba-nobias-$r.txt" 2>&1
done
for f in "$OUT"/ba-*.txt; do echo "== ${f##*/}"; sed -n '1,2p;7,8p;14,15p' "$f"; done
build/bench_lock 2 2000000 >"$OUT/bl-bias.txt" 2>&1
NOFRAG_NO_LOCK_BIAS=1 build/bench_lock 2 2000000 >"$OUT/bl-nobias.txt" 2>&1
cat "$OUT"/bl-*.txt
nf_test_cuda
NOFRAG_BENCH_BUDGET=${NOFRAG_BENCH_BUDGET:-300} OUT="$OUT/torch" bash bench/gpu/run_torch.sh >"$OUT/torch_stdout.log" 2>&1
tail -40 "$OUT/torch/torch_features.md" 2>/dev/null || tail -30 "$OUT/torch_stdout.log"
find "$OUT" \( -name '*.pickle' -o -name '*.so' \) -delete
nf_pack_out cpu.txt test_cuda.log bl-bias.txt bl-nobias.txt # the device tool brings back at most 8 files
