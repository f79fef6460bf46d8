#!/usr/bin/env bash
# The release policy on the GPU, in one call (about 6 minutes): GPT-2 training
# (bench/gpu/train.py, batch 16, sequence length drawn per step, uncapped)
# with release_threshold forced to 10 GB, so that any card shows what an 80 GB
# one does with the default (25 % of it, 21 GB): the cache swings above it
# after every peak. Runs native PyTorch, then nofrag with this tree's policy
# (decay on the low point before each free, and release_idle_ms), with
# release_idle_ms:0 (the low point alone), and, when OLD_SRC names a source
# tree of an earlier commit (e.g. `git archive b75e184 | tar -x -C .old`),
# that tree's policy, built the same way. Then the CUDA test.
# MODEL=llama (train.py's models), THR=2GB (or auto: the default), STEPS, RUNS="native new
# old" (a subset of native new new_idle0 old new_default, in that order) and
# REPEAT=N (each nofrag run N times, alternating) change the call.
# From the repository root: OUT=... OLD_SRC=.old bash bench/gpu/run_release.sh
set -u
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench-out}
STEPS=${STEPS:-30}
THR=${THR:-10GB}
MODEL=${MODEL:-gpt2}
RUNS=" ${RUNS:-native new new_idle0 old new_default} "
REPEAT=${REPEAT:-1}
mkdir -p "$OUT/cells"
export OUT
. bench/gpu/build.sh
nf_build_lib || { tail -30 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1 | tee "$OUT/gpu.txt"

# run NAME LIB PYTHONPATH CONF ALLOC: one training run in its own process
# (cells/NAME-rK.json with REPEAT > 1: the allocators alternate, round by round).
run() {
  local name=$1 lib=$2 py=$3 conf=$4 alloc=$5 cell=$1
  [[ "$RUNS" == *" $name "* ]] || return 0
  [ "$REPEAT" -gt 1 ] && [ "$name" != native ] && cell=$name-r$ROUND
  echo "== $cell: $alloc ${conf:+NOFRAG_CONF=$conf}"
  NOFRAG_LIB=$lib PYTHONPATH=$py NOFRAG_CONF=$conf NOFRAG_ADAPTER_DIR="$OUT/adapter-$name" \
    timeout 300 python3 "$ROOT/bench/gpu/train.py" worker --model "$MODEL" --alloc "$alloc" --steps "$STEPS" \
    --json "$OUT/cells/$cell.json" >"$OUT/cells/$cell.log" 2>&1 || tail -5 "$OUT/cells/$cell.log"
}
NEW_LIB=$ROOT/build/libnofrag.so NEW_PY=$ROOT/python
OLD_LIB=
if [ -n "${OLD_SRC:-}" ] && [ -d "$OLD_SRC" ] && [[ "$RUNS" == *" old "* ]]; then
  (cd "$OLD_SRC" && OUT="$OUT/old" && mkdir -p "$OUT" && nf_build_lib) || echo "old tree: build failed"
  [ -f "$OLD_SRC/build/libnofrag.so" ] && OLD_LIB=$(cd "$OLD_SRC" && pwd)/build/libnofrag.so OLD_PY=$(cd "$OLD_SRC" && pwd)/python
fi
ROUND=1
run native "$NEW_LIB" "$NEW_PY" "" native
for ROUND in $(seq 1 "$REPEAT"); do
  run new "$NEW_LIB" "$NEW_PY" "release_threshold:$THR" nofrag
  run new_idle0 "$NEW_LIB" "$NEW_PY" "release_threshold:$THR,release_idle_ms:0" nofrag
  [ -n "$OLD_LIB" ] && run old "$OLD_LIB" "$OLD_PY" "release_threshold:$THR" nofrag
  run new_default "$NEW_LIB" "$NEW_PY" "" nofrag
done
python3 - "$OUT" <<'EOF' | tee "$OUT/release.md"
import json, os, statistics, sys
out = sys.argv[1]
cells = {}
names = sorted((f[:-5] for f in os.listdir(os.path.join(out, "cells")) if f.endswith(".json")),
               key=lambda n: os.path.getmtime(os.path.join(out, "cells", n + ".json")))
for n in names:
    try:
        cells[n] = json.load(open(os.path.join(out, "cells", n + ".json")))
    except (OSError, ValueError):
        cells[n] = {"status": "no result"}
nat = cells.get("native", {})
nt = nat.get("step_times") or []
# Steps differ in sequence length: compare each step with native's same step
# (median of the ratios), and the sums over steps 3+ (with and without the
# growth steps every allocator pays: those that set a new live peak).
print("| run | status | paired median x native | summed x native (steps 3+) | same, no growth steps | "
      "steps 3+: calls | unmaps | releases | peak physical GiB | losses = native |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
peaks = nat.get("live_peak_by_step") or []
grow = {i for i in range(1, len(peaks)) if peaks[i] > peaks[i - 1]}
for n, c in cells.items():
    k = c.get("calls_by_kind_by_step") or []
    tail = k[3:]
    calls = sum(sum(d.values()) for d in tail) if k else None
    un = sum(d.get("unmap", 0) for d in tail) if k else None
    rel = sum(d.get("release", 0) for d in tail) if k else None
    t = c.get("step_times") or []
    pm = sm = sg = None
    if t and len(t) == len(nt) and len(t) > 3:
        pm = round(statistics.median(a / b for a, b in zip(t[3:], nt[3:])), 3)
        sm = round(sum(t[3:]) / sum(nt[3:]), 3)
        keep = [i for i in range(3, len(t)) if i not in grow]
        sg = round(sum(t[i] for i in keep) / sum(nt[i] for i in keep), 3) if keep else None
    pp = c.get("peak_physical") or c.get("peak_reserved")
    print(f"| {n} | {c.get('status')} | {pm} | {sm} | {sg} | {calls} | {un} | {rel} | "
          f"{pp and round(pp / 2**30, 2)} | {c.get('losses') == nat.get('losses') if nat else None} |")
print("growth steps (new live peak, native):", sorted(grow))
for n, c in cells.items():
    if c.get("calls_by_step"):
        cs = c["calls_by_step"]
        print(f"{n}: calls per step", [b - a for a, b in zip([0] + cs, cs)])
    print(f"{n}: step s", [round(t, 3) for t in c.get("step_times", [])])
EOF
[ -n "${NO_TEST_CUDA:-}" ] || nf_test_cuda
rm -rf "$OUT"/adapter-* "$OUT"/old/adapter-*
nf_pack_out release.md gpu.txt test_cuda.log # the device tool brings back at most 8 files
