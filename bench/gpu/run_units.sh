#!/usr/bin/env bash
# Mapping units (config `units`) on one GPU: build, the C GPU test (its units
# section included), then each model uncapped with native, nofrag and
# nofrag-units (units:16) in one train.py run each, paired step times
# (bench/gpu/paired.py) and the per-step times of the growth steps. With CAPS
# (e.g. 1.01), nofrag and nofrag-units also run capped at those multiples of
# nofrag's uncapped live peak. NF_SKIP_TEST_CUDA=1 skips the C GPU test,
# NF_TEST_CUDA_ONLY=units runs its units section alone.
#
#   OUT=... bash bench/gpu/run_units.sh [MODELS] [BUDGET_S] [CAPS]
set -u
T0=$(date +%s)
OUT=${OUT:-$(pwd)/bench-out-units}
mkdir -p "$OUT"
MODELS=${1:-gpt2,llama,vit} BUDGET=${2:-420} CAPS=${3:-}
exec > >(tee -a "$OUT/units.log") 2>&1
say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
. bench/gpu/build.sh
say "build"
nf_build_lib || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
export NOFRAG_LIB=$PWD/build/libnofrag.so
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
if [ "${NF_SKIP_TEST_CUDA:-0}" != 1 ]; then say "test_cuda"; nf_test_cuda; fi
say "train: $MODELS uncapped, native / nofrag / nofrag-units${CAPS:+; capped at $CAPS x live}"
python3 bench/gpu/train.py --out "$OUT/train" --models "$MODELS" --allocs native,nofrag,nofrag-units --bisect '' \
  --no-limits ${CAPS:+--caps "$CAPS" --capped-allocs nofrag,nofrag-units} --budget $(( BUDGET - ($(date +%s) - T0) )) || echo "train.py exit status $?"
python3 bench/gpu/paired.py "$OUT/train" | tee "$OUT/paired.txt"
say "done"
