#!/usr/bin/env bash
# One-shot GPU proof for nofrag. Run from the repository root on the GPU
# machine:   bash bench/gpu/run.sh
# Results go to $OUT (default ./bench-out): run.log, test_cuda.{log,json},
# replay_device.log, python_tests.log, results.{json,md} (training table), limits.json, runs/*.
# Finishes in about 9 minutes: the training script gets whatever remains of
# NOFRAG_BENCH_BUDGET (default 530 s) after the build and the C test, and each
# configuration runs in its own subprocess with a timeout, so one failure
# never loses the others. Extra arguments go to bench/gpu/train.py
# (e.g. --models gpt2 --bisect '' for a quick run).
set -u
T0=$(date +%s)
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench-out}
mkdir -p "$OUT"
BUDGET=${NOFRAG_BENCH_BUDGET:-530}
exec > >(tee -a "$OUT/run.log") 2>&1
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "== [$(elapsed)s] $*"; }

if [ ! -f include/nofrag.h ] || [ ! -f bench/gpu/train.py ]; then
  echo "run this from the nofrag repository root"; exit 2
fi

say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4
python3 - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0])
for m in ("torch", "transformers", "torchvision"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "MISSING:", e)
EOF

# ------------------------------------------------------------------ build
say "build"
. bench/gpu/build.sh
if ! nf_build_lib; then
  echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1
fi
export NOFRAG_LIB="$ROOT/build/libnofrag.so"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
echo "library: $NOFRAG_LIB ($(stat -L -c %s "$NOFRAG_LIB") bytes)"

# ------------------------------------------------------------------ the machine, as a user would check it
say "nofrag doctor (driver, each GPU's pool written and read back, spill, limits)"
[ -x build/nofrag ] && { ./build/nofrag doctor; echo "doctor exit status: $? (0: nothing failed)"; }

# ------------------------------------------------------------------ C GPU test
say "C test of the CUDA backend and the pool on the GPU (tests/gpu/test_cuda.c)"
nf_test_cuda

# ------------------------------------------------------------------ the GPU replay
say "the bundled traces replayed on the GPU against the CPU (tests/gpu/replay_device.sh)"
timeout 120 sh tests/gpu/replay_device.sh ./build/nofrag >"$OUT/replay_device.log" 2>&1
echo "replay_device exit status: $? (0 pass, 1 fail, 77 skip)"; cat "$OUT/replay_device.log"

# ------------------------------------------------------------------ Python unit tests
say "Python package tests (python/tests)"
timeout 90 python3 -m unittest discover -s python/tests -v >"$OUT/python_tests.log" 2>&1
echo "python tests exit status: $? ; tail:"; tail -5 "$OUT/python_tests.log"

# ------------------------------------------------------------------ training
nf_run_left "training benchmark" bench/gpu/train.py --out "$OUT" "$@"

say "done; results in $OUT"
nf_pack_out results.md results.json run.log test_cuda.log
