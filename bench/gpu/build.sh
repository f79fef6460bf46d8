# Sourced by bench/gpu/run.sh, run_dist.sh and run_spill.sh: build libnofrag
# on the GPU machine (nf_build_lib), run the C GPU test (nf_test_cuda), and
# pack $OUT at the end (nf_pack_out). CMake first (tests off: cmocka may be absent there). If CMake
# fails, compile the library's layers directly (libnofrag needs no zlib; only
# the replay library, not built by the fallback, does).
# Sets LIBS (what a program linking build/libnofrag.a needs); logs to
# $OUT/build.log; returns non-zero when no build/libnofrag.so came out.
nf_build_lib() {
  if command -v cmake >/dev/null 2>&1 &&
     cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DNF_TESTS=OFF >"$OUT/build.log" 2>&1 &&
     cmake --build build -j "$(nproc)" >>"$OUT/build.log" 2>&1 &&
     [ -f build/libnofrag.so ] && [ -f build/libnofrag.a ]; then
    LIBS="-lpthread -ldl -lm"
    return 0
  fi
  echo "cmake build failed or unavailable (tail of build.log below); compiling directly"
  tail -20 "$OUT/build.log" 2>/dev/null
  mkdir -p build/direct && rm -f build/direct/*.o
  local f o
  for f in src/*.c src/base/*.c src/backend/*.c src/core/*.c src/tier/*.c src/observe/*.c src/torch/*.c; do
    o=build/direct/$(echo "$f" | tr / _).o
    gcc -std=c11 -O2 -g -D_GNU_SOURCE -fPIC -fvisibility=hidden -Iinclude -Isrc -c "$f" -o "$o" \
      >>"$OUT/build.log" 2>&1 || { echo "  skipped $f (does not compile here)"; rm -f "$o"; }
  done
  LIBS="-lpthread -ldl -lm"
  gcc -shared -o build/libnofrag.so build/direct/*.o $LIBS >>"$OUT/build.log" 2>&1
  rm -f build/libnofrag.a && ar rcs build/libnofrag.a build/direct/*.o
  [ -f build/libnofrag.so ]
}

# Build and run the GPU test (tests/gpu: test_cuda.c has main) against
# build/libnofrag.a (after nf_build_lib): $OUT/test_cuda.{log,json}, its tail printed.
# NF_TEST_CUDA_ONLY=units (or waits, streams, edges, capture) runs that section alone.
nf_test_cuda() {
  if gcc -std=c11 -O2 -g -D_GNU_SOURCE -Iinclude -Isrc tests/gpu/test_cuda.c tests/gpu/test_cuda_tiers.c \
       tests/gpu/test_cuda_faults.c tests/gpu/test_cuda_waits.c tests/gpu/test_cuda_units.c tests/gpu/test_cuda_streams.c tests/gpu/test_cuda_edges.c tests/gpu/test_cuda_contexts.c tests/gpu/cuda_util.c build/libnofrag.a $LIBS \
       -o build/test_cuda >>"$OUT/build.log" 2>&1; then
    timeout 240 ./build/test_cuda "$OUT/test_cuda.json" ${NF_TEST_CUDA_ONLY:-} >"$OUT/test_cuda.log" 2>&1
    local rc=$?
    tail -30 "$OUT/test_cuda.log"
    echo "test_cuda exit status: $rc (0 pass, 1 fail, 77 skip, 124 timeout)"
  else
    echo "test_cuda did not compile:"; tail -20 "$OUT/build.log"
  fi
}

# The replay on the GPU against the replay on the simulated device
# (tests/gpu/replay_device.sh; after nf_build_lib): same decisions, every block
# verified through device memory, at the minimum capacity and at 1.01 x live.
nf_replay_device() {
  sh tests/gpu/replay_device.sh ./build/nofrag "$@" 2>&1 | tee "$OUT/replay_device.log"
}

# The device tool brings back at most 8 files: pack everything in $OUT into
# all.tar.gz and keep beside it only the files named (read first).
nf_pack_out() {
  local keep=() f
  for f in "$@"; do keep+=(! -name "$f"); done
  (cd "$OUT" && tar czf /tmp/nofrag-pack.tar.gz . && mv /tmp/nofrag-pack.tar.gz all.tar.gz &&
    find . -mindepth 1 -maxdepth 1 ! -name all.tar.gz "${keep[@]}" -exec rm -rf {} +)
  ls -la "$OUT" | head -20
}

# Run a benchmark script with what is left of $BUDGET seconds (the caller's
# elapsed/say helpers), passing --budget; "no time left" below a minute.
#   nf_run_left "training benchmark" bench/gpu/train.py --out "$OUT" "$@"
nf_run_left() {
  local what=$1 left=$(( BUDGET - $(elapsed) - 10 ))
  shift
  say "$what, budget ${left}s ($1)"
  if [ "$left" -gt 60 ]; then
    python3 "$@" --budget "$left"
    echo "$1 exit status: $?"
  else
    echo "no time left for the $what"
  fi
}
