# shellcheck shell=bash
# Sourced by scripts/run.sh and scripts/test.sh (bash).
#
# fresh_build_dir DIR: remove the CMake build directory DIR when its cache was
# configured from another source tree. A checkout copied (or moved) together
# with its build/ carries the original's CMakeCache.txt: `cmake -S . -B build`
# then refuses it ("does not match the source ... used to generate cache"),
# and a bare `cmake --build build` silently rebuilds the ORIGINAL tree (the
# cache and Makefiles hold its absolute paths). Prints what it does on stderr.
fresh_build_dir() {
  local dir=$1 src here
  [ -f "$dir/CMakeCache.txt" ] || return 0
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$dir/CMakeCache.txt")
  here=$(pwd -P)
  if [ -z "$src" ] || [ "$(cd "$src" 2>/dev/null && pwd -P)" != "$here" ]; then
    echo "$dir/ was configured from ${src:-an unknown source tree}, not $here: removing it" >&2
    rm -rf "$dir"
  fi
}
