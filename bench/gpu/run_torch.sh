#!/usr/bin/env bash
# One-shot GPU proof of issue 12 (nofrag as a first-class PyTorch allocator).
# From the repository root on the GPU machine:
#     bash bench/gpu/run_torch.sh            (OUT=... to choose the output folder)
#     bash bench/gpu/run_torch.sh --dry-run  (here, without torch: orchestration only)
# Builds libnofrag (bench/gpu/build.sh), the C++ adapter (inside the script,
# log printed on failure), then runs bench/gpu/torch_features.py with what is
# left of NOFRAG_BENCH_BUDGET (default 500 s). Results: $OUT/torch_features.{json,md},
# cells/*.{json,log}, snapshot-*.pickle, llama1b_ga4_ckpt.pickle.gz, run_torch.log.
# At the end $OUT is packed for the device tool (at most 8 files come back):
# torch_features.md, torch_features.json, run_torch.log stay as they are;
# everything (those too, the adapter's build.log, the per-case logs, the
# snapshots and the llama trace) is in $OUT/all.tar.gz.
set -u
T0=$(date +%s)
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench-out}
mkdir -p "$OUT"
BUDGET=${NOFRAG_BENCH_BUDGET:-500}
exec > >(tee -a "$OUT/run_torch.log") 2>&1
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "== [$(elapsed)s] $*"; }
DRY=""
for a in "$@"; do [ "$a" = "--dry-run" ] && DRY=1; done

if [ ! -f include/nofrag.h ] || [ ! -f bench/gpu/torch_features.py ]; then
  echo "run this from the nofrag repository root"; exit 2
fi
say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
python3 -c "import sys; print('python', sys.version.split()[0])
for m in ('torch', 'transformers', 'torchvision'):
    try:
        print(m, __import__(m).__version__)
    except Exception as e:
        print(m, 'MISSING:', e)" 2>&1
command -v g++ ninja nvcc 2>&1

say "build libnofrag"
. bench/gpu/build.sh
if [ -n "$DRY" ] && [ -f build/libnofrag.so ] && [ -x build/nofrag ]; then
  echo "DRY RUN: using the existing build/"
elif ! nf_build_lib; then
  echo "BUILD FAILED"; tail -40 "$OUT/build.log"; nf_pack_out run_torch.log; exit 1
fi
export NOFRAG_LIB="$ROOT/build/libnofrag.so"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

say "adapter + cases (budget $(( BUDGET - $(elapsed) )) s)"
python3 bench/gpu/torch_features.py --out "$OUT" --budget $(( BUDGET - $(elapsed) )) "$@"
say "done; results in $OUT (packing: all.tar.gz)"
nf_pack_out torch_features.md torch_features.json run_torch.log
