#!/bin/sh
# No layer of libnofrag calls up: every symbol an object file of layer L uses
# from another object file is defined in layer L or below. Layers, bottom up
# (docs/design.md): base < backend < core < tier = observe < nofrag.c < torch
# (the PyTorch plug-in is a client of the assembled library).
# tier and observe are siblings: neither may call the other.
# Inside the core the files are ordered too (core_rank below, bottom up):
# blockmap/config/granule < freelist < publish < stream < view < unit = chunk < vmm <
# placement = edge < private_pool < stats < pool, capacity, peer (siblings: none
# calls another); a call between two core files goes strictly down (stream
# tells the views of a released block through a hook).
# Usage: test_layers.sh OBJDIR OBJ... (the nofrag_obj object directory, .../src,
# and the object files of the library, as CMake lists them: a build directory
# may hold stale objects of files that were moved).
set -eu
dir=$1
rank() {
  case $1 in
    base/*) echo 0 ;; backend/*) echo 1 ;; core/*) echo 2 ;;
    tier/*) echo 3 ;; observe/*) echo 3 ;; nofrag.c.o) echo 4 ;; torch/*) echo 5 ;;
    *) echo "unknown layer: $1" >&2; exit 2 ;;
  esac
}
shift
objs=$(for o in "$@"; do echo "${o#"$dir"/}"; done | sort)
core_rank() {
  case ${1#core/} in
    blockmap.c.o|config.c.o|granule.c.o) echo 0 ;; freelist.c.o) echo 1 ;; publish.c.o) echo 2 ;;
    stream.c.o) echo 3 ;; view.c.o) echo 4 ;; unit.c.o|chunk.c.o) echo 5 ;; vmm.c.o) echo 6 ;; placement.c.o|edge.c.o) echo 7 ;;
    private_pool.c.o) echo 8 ;; stats.c.o) echo 9 ;; pool.c.o|capacity.c.o|peer.c.o) echo 10 ;;
    *) echo "unknown core file: $1 (give it a rank in tests/test_layers.sh)" >&2; exit 2 ;;
  esac
}
cd "$dir"
[ -n "$objs" ] || { echo "no object files under $dir" >&2; exit 2; }
defs=$(mktemp)
trap 'rm -f "$defs"' EXIT
for o in $objs; do
  nm --defined-only -g "$o" | awk -v o="$o" 'NF==3 {print $3, o}'
done | sort >"$defs"
bad=0 edges=0
for o in $objs; do
  r=$(rank "$o")
  for sym in $(nm -u "$o" | awk '{print $2}'); do
    d=$(awk -v s="$sym" '$1==s {print $2; exit}' "$defs")
    [ -n "$d" ] || continue # libc, libdl, pthreads
    [ "$d" = "$o" ] && continue
    edges=$((edges + 1))
    rd=$(rank "$d")
    dl=${d%%/*} ol=${o%%/*}
    if [ "$dl" = core ] && [ "$ol" = core ] && [ "$(core_rank "$d")" -ge "$(core_rank "$o")" ]; then
      echo "core order violation: $o calls $sym, defined in $d" >&2
      bad=$((bad + 1))
    elif [ "$rd" -gt "$r" ] || { [ "$rd" -eq "$r" ] && [ "$r" -eq 3 ] && [ "$dl" != "$ol" ]; }; then
      echo "layer violation: $o calls $sym, defined in $d" >&2
      bad=$((bad + 1))
    fi
  done
done
echo "layers: $edges cross-file calls checked, $bad calling up"
[ "$edges" -gt 0 ] || { echo "no cross-file calls found: wrong object list?" >&2; exit 2; }
[ "$bad" -eq 0 ]
