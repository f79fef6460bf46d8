#!/usr/bin/env bash
# A/B of this checkout's library against another build of it, on one GPU, in
# rounds (each round: native and nofrag uncapped, then nofrag and nofrag-base
# at CAP x nofrag's live peak; paired step times against the round's native):
#
#   git archive BASE_COMMIT src include cmake CMakeLists.txt | (mkdir -p build-base-src && tar -x -C build-base-src)
#   BASE_SRC=build-base-src bash bench/gpu/run_ab.sh MODEL CAP ROUNDS [BUDGET_S]
#
# (build-base-src is ignored by git: the device tool must carry it.) Output in
# $OUT: ab.log, paired.txt (bench/gpu/paired.py over the rounds), rN/ per
# round, test_cuda.log when NF_AB_TEST_CUDA=1. The rounds share the budget.
# ALLOCS (uncapped, default native,nofrag) and CAPPED (at CAP, default
# nofrag,nofrag-base) change what each round runs; without nofrag-base in
# them, BASE_SRC is not needed (e.g. ALLOCS=native,nofrag,nofrag-tight CAPPED=nofrag).
# STEPS: steps per run (default 0: the model's default, 20).
set -u
T0=$(date +%s)
OUT=${OUT:-$(pwd)/bench-out-ab}
mkdir -p "$OUT"
MODEL=${1:-llama} CAP=${2:-1.01} ROUNDS=${3:-2} BUDGET=${4:-540}
ALLOCS=${ALLOCS:-native,nofrag} CAPPED=${CAPPED:-nofrag,nofrag-base} STEPS=${STEPS:-0}
exec > >(tee -a "$OUT/ab.log") 2>&1
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "== [$(elapsed)s] $*"; }

. bench/gpu/build.sh
say "build this checkout"
nf_build_lib || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
export NOFRAG_LIB=$PWD/build/libnofrag.so
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
case ",$ALLOCS,$CAPPED," in *,nofrag-base,*)
  [ -d "${BASE_SRC:-}" ] || { echo "BASE_SRC must name a source snapshot (see the header)"; exit 2; }
  say "build the base ($BASE_SRC)"
  cmake -S "$BASE_SRC" -B "$BASE_SRC/build" -DCMAKE_BUILD_TYPE=Release -DNF_TESTS=OFF >"$OUT/build-base.log" 2>&1 &&
    cmake --build "$BASE_SRC/build" -j "$(nproc)" >>"$OUT/build-base.log" 2>&1 ||
    { echo "BASE BUILD FAILED"; tail -30 "$OUT/build-base.log"; exit 1; }
  export NOFRAG_BASE_LIB=$PWD/$BASE_SRC/build/libnofrag.so
  cmp -s "$NOFRAG_LIB" "$NOFRAG_BASE_LIB" && echo "warning: the two libraries are identical";;
esac
if [ "${NF_AB_TEST_CUDA:-0}" = 1 ]; then say "test_cuda (this checkout)"; nf_test_cuda; fi

for r in $(seq 1 "$ROUNDS"); do
  left=$(( (BUDGET - $(elapsed)) / (ROUNDS - r + 1) ))
  say "round $r of $ROUNDS, ${left}s"
  [ "$left" -gt 60 ] || { echo "no time left"; break; }
  python3 bench/gpu/train.py --out "$OUT/r$r" --budget "$left" --models "$MODEL" --steps "$STEPS" --allocs "$ALLOCS" \
    --caps "$CAP" --capped-allocs "$CAPPED" --bisect '' --no-limits >"$OUT/r$r.log" 2>&1
  echo "round $r exit status $?"; grep -E "^\| $MODEL" "$OUT/r$r/results.md" 2>/dev/null
done
say "paired step times"
python3 bench/gpu/paired.py "$OUT"/r*/ | tee "$OUT/paired.txt"
nf_pack_out ab.log paired.txt test_cuda.log
