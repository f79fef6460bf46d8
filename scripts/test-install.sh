#!/usr/bin/env bash
# Install checks (issue 14): nofrag used the way a new user would, from this
# checkout, never from its build tree.
#
#   1. CMake: configure + build in a directory OUTSIDE the checkout (the CLI
#      must still find its Python helper: test_formats reads a PyTorch pickle),
#      `cmake --install --prefix P`, then that build directory is deleted;
#   2. examples/host_pool.c built against P with pkg-config and with
#      find_package(nofrag) (shared and static), and run. P/lib is not on the
#      loader's path, so the pkg-config build runs with LD_LIBRARY_PATH=P/lib,
#      as a user of a non-system prefix would (CMake's build has an RPATH);
#   3. P/bin/nofrag version, and a PyTorch pickle read through P's share/;
#   4. pip: `pip install --no-index CHECKOUT` (the plain offline command) into a fresh
#      `python3 -m venv --system-site-packages` venv, then from another
#      directory without PYTHONPATH / NOFRAG_LIB: nofrag.Pool allocates, frees,
#      refuses a double free with NofragError; the venv's `nofrag version`;
#      python/tests copied out of the checkout and run against the installed
#      package; `pip wheel` gives a platform wheel that installs in a second venv;
#      `python3 -m nofrag --help` and `-m nofrag.torch_trace --help` exit 0 with
#      nothing on stderr (no runpy RuntimeWarning);
#   5. a CMake install with CMAKE_INSTALL_LIBDIR=lib64, its prefix then moved:
#      the Python package under share/ still finds lib64/libnofrag.so;
#   6. the sdist (`setup.py sdist`) carries the C sources: it builds and
#      installs in a fresh venv, and the package imports and allocates;
#   7. a copied checkout (only its source files, then configured build/ and
#      build-pip/, then copied again): scripts/run.sh in the copy configures and
#      builds the copy, not the original, and its --json is one JSON object;
#      `pip install -e` in the copy (the legacy `setup.py develop` and PEP 660)
#      imports nofrag from the copy's python/ and loads the libnofrag.so it
#      built there.
#
# The venv is made from /usr/bin/python3 (Debian's, with python3-setuptools and
# python3-wheel: scripts/setup-deps.sh installs them); NF_PYTHON overrides.
# pyenv-style interpreters without the `wheel` package cannot build offline.
# Prints one line per check and "install checks: N passed, M failed"; exits
# non-zero if any failed. Scratch space: a mktemp directory, removed at exit
# (NF_KEEP=1 keeps it).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1

bash scripts/setup-deps.sh || exit 1

TMP=$(mktemp -d /tmp/nofrag-install.XXXXXX)
if [ "${NF_KEEP:-0}" != 1 ]; then trap 'rm -rf "$TMP"' EXIT; else echo "scratch: $TMP"; fi
PREFIX=$TMP/prefix
BUILD=$TMP/build
LOG=$TMP/log
mkdir -p "$LOG" "$TMP/elsewhere"
JOBS=$(nproc)
PASS=0 FAIL=0
PICKLE=$ROOT/../shared/traces/gpt2_small_snapshot.pickle.gz

# check NAME CMD...: run CMD (output to $LOG/N.log, shown on failure).
check() {
  local name=$1 n=$((PASS + FAIL + 1))
  shift
  if "$@" >"$LOG/$n.log" 2>&1; then
    PASS=$((PASS + 1))
    printf 'ok    %s\n' "$name"
  else
    FAIL=$((FAIL + 1))
    printf 'FAIL  %s\n' "$name"
    sed 's/^/      | /' "$LOG/$n.log" | tail -40
  fi
}

PY=${NF_PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3

# ------------------------------------------------------------ CMake install
cmake_build() {
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNF_TESTS=ON &&
    cmake --build "$BUILD" -j"$JOBS" --target nofrag nofrag_static nofrag_cli test_formats
}
check "cmake build outside the checkout ($BUILD)" cmake_build
check "test_formats from the out-of-tree build (CLI reads PyTorch pickles)" \
  ctest --test-dir "$BUILD" --output-on-failure -R '^test_formats$' --no-tests=error
check "cmake --install --prefix $PREFIX" cmake --install "$BUILD" --prefix "$PREFIX"

installed_files() {
  local f
  for f in include/nofrag.h lib/libnofrag.so lib/libnofrag.a bin/nofrag lib/pkgconfig/nofrag.pc \
    lib/cmake/nofrag/nofragConfig.cmake lib/cmake/nofrag/nofragConfigVersion.cmake \
    share/nofrag/python/nofrag/torch_trace.py share/nofrag/python/nofrag/_version.py; do
    [ -e "$PREFIX/$f" ] || { echo "missing: $PREFIX/$f"; return 1; }
  done
  # The SONAME is versioned and the chain of links points at a real file.
  objdump -p "$PREFIX/lib/libnofrag.so" | grep -E 'SONAME +libnofrag\.so\.[0-9]+$' &&
    [ -f "$(readlink -f "$PREFIX/lib/libnofrag.so")" ]
}
check "installed files, SONAME" installed_files

# The Python package under share/ finds the library of its own prefix, with
# CMAKE_INSTALL_LIBDIR=lib64 too (a multiarch or lib64 system), and after the
# prefix is moved. Reconfigures $BUILD (deleted next) for the second install.
share_python_lib() { # share_python_lib PREFIX LIBDIR
  (cd "$TMP/elsewhere" && env -u NOFRAG_LIB PYTHONPATH="$1/share/nofrag/python" "$PY" -c '
import os, sys, nofrag
prefix, libdir = sys.argv[1], sys.argv[2]
assert nofrag.__file__.startswith(prefix + "/"), nofrag.__file__
want = os.path.realpath(os.path.join(prefix, libdir, "libnofrag.so"))
assert nofrag._lib.path() == want, (nofrag._lib.path(), want)
with nofrag.Pool("backend:host,limit:64MiB") as p: p.free(p.alloc(4096))
print("library", nofrag._lib.path())' "$1" "$2")
}
check "share/nofrag/python finds $PREFIX/lib/libnofrag.so" share_python_lib "$PREFIX" lib
lib64_install() {
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_INSTALL_LIBDIR=lib64 >/dev/null &&
    cmake --install "$BUILD" --prefix "$TMP/prefix64" >/dev/null || return 1
  if [ ! -e "$TMP/prefix64/lib64/libnofrag.so" ] || [ -e "$TMP/prefix64/lib" ]; then echo "not a lib64 layout"; return 1; fi
  mv "$TMP/prefix64" "$TMP/prefix64-moved" && share_python_lib "$TMP/prefix64-moved" lib64
}
check "CMAKE_INSTALL_LIBDIR=lib64, prefix moved: share/nofrag/python finds lib64/libnofrag.so" lib64_install
# From here on nothing may come from the build tree.
rm -rf "$BUILD"

# ------------------------------------------------------------ consumers
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
pc_build() {
  local flags
  flags=$(pkg-config --cflags --libs nofrag) || return 1
  echo "pkg-config: $flags"
  # shellcheck disable=SC2086
  cc -std=c11 -Wall -Werror "$ROOT/examples/host_pool.c" $flags -o "$TMP/host_pool_pc" &&
    [ "$(pkg-config --modversion nofrag)" = "$(sed -n 's/^#define NF_VERSION "\(.*\)"/\1/p' "$ROOT/include/nofrag.h")" ]
}
check "examples/host_pool.c built with pkg-config" pc_build
pc_run() {
  # Not found without the prefix on the loader's path: proof it links P's copy.
  if "$TMP/host_pool_pc" 2>/dev/null; then echo "ran without LD_LIBRARY_PATH: which libnofrag?"; return 1; fi
  LD_LIBRARY_PATH=$PREFIX/lib "$TMP/host_pool_pc" &&
    LD_LIBRARY_PATH=$PREFIX/lib ldd "$TMP/host_pool_pc" | grep -F "$PREFIX/lib/libnofrag.so.0"
}
check "pkg-config build runs (LD_LIBRARY_PATH=$PREFIX/lib)" pc_run
unset PKG_CONFIG_PATH

cm_build() {
  cmake -S "$ROOT/examples" -B "$TMP/ex-cmake" -DCMAKE_PREFIX_PATH="$PREFIX" &&
    cmake --build "$TMP/ex-cmake" -j"$JOBS" &&
    grep -F "nofrag_DIR:PATH=$PREFIX/lib/cmake/nofrag" "$TMP/ex-cmake/CMakeCache.txt"
}
check "examples/ built with find_package(nofrag) (CMAKE_PREFIX_PATH)" cm_build
check "find_package build runs: nofrag::nofrag (shared)" "$TMP/ex-cmake/host_pool"
check "find_package build runs: nofrag::nofrag_static" "$TMP/ex-cmake/host_pool_static"

cli_version() {
  local v
  v=$("$PREFIX/bin/nofrag" version) && echo "$v" && [ "$v" = "nofrag $(sed -n 's/^#define NF_VERSION "\(.*\)"/\1/p' "$ROOT/include/nofrag.h")" ]
}
check "$PREFIX/bin/nofrag version" cli_version
cli_pickle() {
  if [ ! -f "$PICKLE" ]; then echo "no $PICKLE: skipped"; return 0; fi
  (cd "$TMP/elsewhere" && env -u PYTHONPATH -u NOFRAG_PYTHON_DIR "$PREFIX/bin/nofrag" replay "$PICKLE")
}
check "installed CLI reads a PyTorch pickle (share/nofrag/python)" cli_pickle

# ------------------------------------------------------------ pip
VENV=$TMP/venv
venv_make() {
  "$PY" -c 'import setuptools, wheel' || { echo "$PY lacks setuptools/wheel (python3-setuptools python3-wheel)"; return 1; }
  "$PY" -m venv --system-site-packages "$VENV"
}
check "python3 -m venv --system-site-packages ($PY)" venv_make
check "pip install --no-index $ROOT" \
  "$VENV/bin/pip" install --no-index "$ROOT"

# Everything below runs from $TMP/elsewhere with PYTHONPATH/NOFRAG_LIB unset.
in_venv() { (cd "$TMP/elsewhere" && env -u PYTHONPATH -u NOFRAG_LIB -u NOFRAG_PYTHON_DIR "$@"); }
py_pool() {
  in_venv "$VENV/bin/python" -c '
import os, sys, nofrag
venv = sys.argv[1]
assert nofrag.__file__.startswith(venv + "/"), nofrag.__file__
assert nofrag._lib.path().startswith(venv + "/"), nofrag._lib.path()
pool = nofrag.Pool("backend:host,limit:256MiB")
p = pool.alloc(1 << 20)
pool.free(p)
try:
    pool.free(p)
    sys.exit("double free accepted")
except nofrag.NofragError as e:
    print("double free refused:", e)
    assert e.status_name == "NF_ERR_INVALID"
pool.close()
print("nofrag", nofrag.__version__, "from", nofrag.__file__, "library", nofrag._lib.path())
' "$VENV"
}
check "installed package: Pool alloc/free/double free -> NofragError (no PYTHONPATH, NOFRAG_LIB)" py_pool
check "venv's nofrag version" in_venv "$VENV/bin/nofrag" version
venv_pickle() {
  if [ ! -f "$PICKLE" ]; then echo "no $PICKLE: skipped"; return 0; fi
  in_venv "$VENV/bin/nofrag" replay "$PICKLE"
}
check "venv's nofrag reads a PyTorch pickle" venv_pickle
py_tests() {
  cp -r "$ROOT/python/tests" "$TMP/elsewhere/tests" &&
    # The tests put their parent directory first on sys.path: here it has no
    # nofrag/, so they import the installed package; make sure of it.
    in_venv "$VENV/bin/python" -c 'import sys; sys.path.insert(0, sys.argv[1]); import nofrag
assert nofrag.__file__.startswith(sys.argv[2] + "/"), nofrag.__file__' "$TMP/elsewhere" "$VENV" &&
    in_venv env NF_SHARED="$ROOT/../shared" "$VENV/bin/python" -m unittest discover -s tests -v
}
check "python/tests (copied out of the checkout) against the installed package" py_tests

wheel_check() {
  "$VENV/bin/pip" wheel --no-index --no-build-isolation --no-deps -w "$TMP/wheels" "$ROOT" || return 1
  local whl
  whl=$(ls "$TMP"/wheels/nofrag-*.whl) || return 1
  echo "wheel: $whl"
  case $whl in *-none-any.whl) echo "a pure wheel: it must be platform-tagged"; return 1 ;; esac
  "$PY" -m venv --system-site-packages "$TMP/venv2" &&
    "$TMP/venv2/bin/pip" install --no-index "$whl" &&
    in_venv "$TMP/venv2/bin/python" -c 'import nofrag
with nofrag.Pool("backend:host,limit:64MiB") as p: p.free(p.alloc(4096))
print(nofrag._lib.path())' &&
    in_venv "$TMP/venv2/bin/nofrag" version
}
check "pip wheel: platform wheel that installs in another venv" wheel_check
# A venv without `wheel` (plain, not --system-site-packages): pip wheel must
# fail naming the cause (it said "error: invalid command 'bdist_wheel'").
no_wheel_check() {
  "$PY" -m venv "$TMP/venv-nowheel" || return 1
  if "$TMP/venv-nowheel/bin/python" -c 'import wheel' 2>/dev/null; then echo "this venv has wheel: nothing to check"; return 0; fi
  if "$TMP/venv-nowheel/bin/pip" wheel --no-index --no-build-isolation --no-deps -w "$TMP/wheels-no" "$ROOT" \
    >"$TMP/nowheel.log" 2>&1; then
    echo "pip wheel succeeded without the wheel package?"
    return 1
  fi
  grep -F "building a wheel needs the 'wheel' package" "$TMP/nowheel.log" || { cat "$TMP/nowheel.log"; return 1; }
}
check "pip wheel in a venv without wheel: fails naming the missing package" no_wheel_check

py_help() {
  local m out
  for m in nofrag nofrag.torch_trace; do
    out=$(in_venv "$VENV/bin/python" -m "$m" --help 2>"$TMP/help.err") || { echo "-m $m --help: exit $?"; return 1; }
    [ ! -s "$TMP/help.err" ] || { echo "-m $m --help wrote on stderr:"; cat "$TMP/help.err"; return 1; }
    case $out in usage:*) echo "$out" ;; *) echo "-m $m --help: no usage on stdout: $out"; return 1 ;; esac
  done
}
check "python3 -m nofrag --help, -m nofrag.torch_trace --help: exit 0, stderr empty" py_help

# ------------------------------------------------------------ sdist
sdist_check() {
  (cd "$ROOT" && "$PY" setup.py -q sdist -d "$TMP/sdist") || return 1
  local sd
  sd=$(ls "$TMP"/sdist/nofrag-*.tar.gz) || return 1
  echo "sdist: $sd"
  if tar tzf "$sd" | grep -E 'libnofrag\.so|/_bin/|CMakeCache|__pycache__'; then
    echo "build outputs in the sdist"
    return 1
  fi
  "$PY" -m venv --system-site-packages "$TMP/venv-sdist" &&
    in_venv "$TMP/venv-sdist/bin/pip" install --no-index --no-build-isolation "$sd" &&
    in_venv "$TMP/venv-sdist/bin/python" -c 'import sys, nofrag
assert nofrag._lib.path().startswith(sys.argv[1] + "/"), nofrag._lib.path()
with nofrag.Pool("backend:host,limit:64MiB") as p: p.free(p.alloc(4096))
print("nofrag", nofrag.__version__, nofrag._lib.path())' "$TMP/venv-sdist" &&
    in_venv "$TMP/venv-sdist/bin/nofrag" version
}
check "setup.py sdist: builds and installs in a fresh venv, imports, allocates" sdist_check

# ------------------------------------------------------------ copied checkout
# A checkout's source files (tracked and untracked, not ignored: no build
# directories) copied to $1.
copy_checkout() {
  mkdir -p "$1" || return 1
  if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z -co --exclude-standard |
      while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
      tar --null -T - -cf -) | tar -xf - -C "$1"
  else
    tar -C "$ROOT" --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C "$1"
  fi
}
ORIG=$TMP/checkout-orig COPY=$TMP/checkout-copy
copy_setup() {
  # The original: build/ and build-pip/cmake configured (not built) from it.
  copy_checkout "$ORIG" &&
    cmake -S "$ORIG" -B "$ORIG/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNF_TESTS=OFF >/dev/null &&
    cmake -S "$ORIG" -B "$ORIG/build-pip/cmake" -DCMAKE_BUILD_TYPE=Release -DNF_TESTS=OFF >/dev/null &&
    cp -a "$ORIG" "$COPY"
}
check "a checkout with configured build/ and build-pip/, copied ($COPY)" copy_setup
home_is() { # home_is BUILD_DIR SRC: the CMake cache of BUILD_DIR was configured from SRC
  grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$2" "$1/CMakeCache.txt" || {
    echo "$1 configured from: $(grep '^CMAKE_HOME_DIRECTORY' "$1/CMakeCache.txt"), not $2"
    return 1
  }
}
copy_run() {
  (cd "$COPY" && bash scripts/run.sh) || return 1
  home_is "$COPY/build" "$COPY" && [ -x "$COPY/build/nofrag" ] &&
    if [ -e "$ORIG/build/nofrag" ]; then echo "run.sh in the copy built the original's build/"; return 1; fi
}
check "copied checkout: scripts/run.sh reconfigures and builds the copy (not the original)" copy_run
# run.sh --json: stdout is one JSON object (setup-deps' "all packages present"
# line came first on stdout, so `run.sh --json | python3 -m json.tool` failed).
run_json() {
  (cd "$COPY" && bash scripts/run.sh --json) >"$TMP/run.json" || return 1
  "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["nofrag"]["status"] == "ok", d' "$TMP/run.json"
}
check "scripts/run.sh --json prints one JSON object on stdout" run_json
# pip install -e in the copy: the package is the copy's python/nofrag, with
# libnofrag.so and _bin/nofrag built there (build-pip/cmake of the original
# wiped and configured afresh). $1: extra pip options (--use-pep517: the
# PEP 660 path newer pips always take).
editable_check() {
  local venv=$TMP/venv-edit
  [ -d "$venv" ] || "$PY" -m venv --system-site-packages "$venv" || return 1
  "$venv/bin/pip" uninstall -y -q nofrag >/dev/null 2>&1
  rm -rf "$COPY/python/nofrag/libnofrag.so" "$COPY/python/nofrag/_bin"
  # shellcheck disable=SC2086
  (cd "$COPY" && "$venv/bin/pip" install --no-index --no-build-isolation $1 -e .) &&
    home_is "$COPY/build-pip/cmake" "$COPY" &&
    in_venv "$venv/bin/python" -c 'import os, sys, nofrag
pkg = os.path.join(sys.argv[1], "python", "nofrag")
assert os.path.dirname(nofrag.__file__) == pkg, nofrag.__file__
assert nofrag._lib.path() == os.path.realpath(os.path.join(pkg, "libnofrag.so")), nofrag._lib.path()
with nofrag.Pool("backend:host,limit:64MiB") as p: p.free(p.alloc(4096))
print("nofrag", nofrag.__version__, "from", nofrag.__file__, "library", nofrag._lib.path())' "$COPY" &&
    in_venv "$venv/bin/nofrag" version
}
check "copied checkout: pip install -e . (setup.py develop) imports the copy's python/, loads its libnofrag.so" \
  editable_check ""
check "copied checkout: pip install --use-pep517 -e . (PEP 660) imports and loads the same" \
  editable_check --use-pep517

echo "install checks: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
