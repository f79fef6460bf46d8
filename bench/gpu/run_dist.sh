#!/usr/bin/env bash
# Multi-GPU proof for nofrag (issue 6): torchrun + FSDP2 (Llama 1.1B) and DDP
# (GPT-2) under PyTorch native, expandable_segments and nofrag. Run from the
# repository root on a machine with 2 GPUs:   bash bench/gpu/run_dist.sh
# One GPU (world size 1 rehearsal):           bash bench/gpu/run_dist.sh --nproc-per-node 1
# No GPU, no torch (orchestration only):      bash bench/gpu/run_dist.sh --dry-run
# Results go to $OUT (default ./bench-out-dist): run.log, results.{md,json},
# and all.tar.gz holding everything (runs/*/rank<R>.json, launch logs, build.log).
# Finishes in about 9 minutes: dist.py gets what remains of NOFRAG_BENCH_BUDGET
# (default 530 s) after the build. Extra arguments go to bench/gpu/dist.py.
set -u
T0=$(date +%s)
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench-out-dist}
mkdir -p "$OUT"
BUDGET=${NOFRAG_BENCH_BUDGET:-530}
exec > >(tee -a "$OUT/run.log") 2>&1
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "== [$(elapsed)s] $*"; }

if [ ! -f include/nofrag.h ] || [ ! -f bench/gpu/dist.py ]; then
  echo "run this from the nofrag repository root"; exit 2
fi
# No multicast objects anywhere (dist.py sets them again for every launch).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

DRY=0
for a in "$@"; do [ "$a" = "--dry-run" ] && DRY=1; done

. bench/gpu/build.sh # nf_build_lib, nf_pack_out
say "machine"
NGPU=0
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 | head -8
  NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
  nvidia-smi topo -m 2>&1 | head -12
fi
echo "GPUs: $NGPU"
python3 - <<'PYEOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0])
for m in ("torch", "transformers"):
    try:
        mod = importlib.import_module(m)
        print(m, mod.__version__)
        if m == "torch":
            import torch.distributed as d
            print("  nccl available:", d.is_nccl_available(),
                  "nccl", getattr(__import__("torch").cuda.nccl, "version", lambda: "?")())
    except Exception as e:
        print(m, "MISSING:", e)
PYEOF
# Default world size 2, or fewer when the machine has fewer GPUs (a later
# --nproc-per-node in the arguments wins).
NPROC=${NPROC:-2}
if [ "$DRY" = 0 ] && [ "$NGPU" -gt 0 ] && [ "$NGPU" -lt "$NPROC" ]; then
  echo "only $NGPU GPU(s): world size $NGPU"; NPROC=$NGPU
fi

# ------------------------------------------------------------------ build
# Re-use build/libnofrag.so when it is newer than every source; else build as
# bench/gpu/run.sh does (CMake, or the sources compiled directly).
say "build"
LIB=build/libnofrag.so
if [ -f "$LIB" ] && [ -z "$(find src include -newer "$LIB" -name '*.[ch]' 2>/dev/null | head -1)" ]; then
  echo "re-using $LIB (newer than src/ and include/)"
else
  nf_build_lib
fi
if [ ! -f "$LIB" ]; then
  echo "BUILD FAILED"; tail -40 "$OUT/build.log"
  [ "$DRY" = 1 ] || exit 1
fi
export NOFRAG_LIB="$ROOT/$LIB"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
[ -f "$LIB" ] && echo "library: $NOFRAG_LIB ($(stat -L -c %s "$NOFRAG_LIB") bytes)"

# ------------------------------------------------------------------ torchrun launches
nf_run_left "distributed benchmark (world size $NPROC; exit 0: every uncapped launch ok)" \
  bench/gpu/dist.py --out "$OUT" --nproc-per-node "$NPROC" "$@"

say "done; results in $OUT"
nf_pack_out results.md results.json run.log
