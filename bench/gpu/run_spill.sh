#!/usr/bin/env bash
# GPU proof of spill and same-address offload (issue 7). Run from the
# repository root on the GPU machine (one H200):
#     bash bench/gpu/run_spill.sh            # or: OUT=/some/dir bash bench/gpu/run_spill.sh
# Builds build/libnofrag.so (bench/gpu/build.sh), runs tests/gpu/test_cuda.c
# (NOFRAG_TEST_CUDA=0 skips it) and the Python offload tests
# (python/tests/test_offload*.py, including the real-torch GPU round trip),
# then bench/gpu/spill.py with what remains of NOFRAG_SPILL_BUDGET (default
# 480 s; every configuration in its own subprocess with a timeout, results
# written after each one). At the end everything is packed into
# $OUT/all.tar.gz and only results.md, results.json, run.log and test_cuda.log are kept
# beside it (the device tool returns at most 8 files).
# Extra arguments go to spill.py (e.g. --parts spill). --dry-run: no build,
# fake workers (tests this script and spill.py's orchestration without torch;
# NOFRAG_LIB must then point at an existing build).
set -u
T0=$(date +%s)
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench-out}
mkdir -p "$OUT"
BUDGET=${NOFRAG_SPILL_BUDGET:-480}
DRY=0
for arg in "$@"; do [ "$arg" = "--dry-run" ] && DRY=1; done
exec > >(tee -a "$OUT/run.log") 2>&1
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "== [$(elapsed)s] $*"; }

if [ ! -f include/nofrag.h ] || [ ! -f bench/gpu/spill.py ]; then
  echo "run this from the nofrag repository root"; exit 2
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

. bench/gpu/build.sh # nf_build_lib, nf_pack_out
say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4
free -g 2>/dev/null | head -2
python3 - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0])
for m in ("torch", "transformers"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "MISSING:", e)
EOF

# ------------------------------------------------------------------ build
if [ "$DRY" = 1 ]; then
  say "dry run: no build"
  export NOFRAG_LIB=${NOFRAG_LIB:-$ROOT/build/libnofrag.so}
else
  say "build"
  if ! nf_build_lib; then
    echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1
  fi
  export NOFRAG_LIB="$ROOT/build/libnofrag.so"
fi
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
echo "library: $NOFRAG_LIB"
python3 - "$NOFRAG_LIB" <<'EOF' 2>&1
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
names = ("nf_offload", "nf_prefetch", "nf_offload_wait", "nf_block_tiers")
print("offload symbols:", ", ".join(f"{n} {'yes' if hasattr(lib, n) else 'MISSING'}" for n in names))
EOF

# ------------------------------------------------------------------ C GPU test
if [ "$DRY" = 0 ] && [ "${NOFRAG_TEST_CUDA:-1}" = 1 ]; then
  say "C test of the CUDA backend and the pool on the GPU (tests/gpu/test_cuda.c; NOFRAG_TEST_CUDA=0 skips)"
  nf_test_cuda
fi

# ------------------------------------------------------------------ Python tests
say "Python offload tests (python/tests/test_offload*.py; the GPU round trip needs torch + CUDA)"
(cd python/tests && timeout 120 python3 -m unittest test_offload test_offload_torch -v) \
  >"$OUT/python_offload_tests.log" 2>&1
echo "python offload tests exit status: $? ; tail:"; tail -6 "$OUT/python_offload_tests.log"

# ------------------------------------------------------------------ benchmark
nf_run_left "spill/offload benchmark" bench/gpu/spill.py --out "$OUT" "$@"

say "done; results in $OUT"
nf_pack_out results.md results.json run.log test_cuda.log
