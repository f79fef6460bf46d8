#!/bin/sh
# `nofrag top` against a real process, under tmux (issue 5): a holder process
# (`nofrag top --selftest-hold`, a host pool with 12345678 live bytes and a
# steady allocation rate) publishes its stats; `nofrag top` runs in a detached
# tmux session; capture-pane must show the holder's pid and live bytes; `q`
# must quit and give the shell back. Then --once --json, file removal at exit,
# and a holder that exec()s: its file is dead. Exit 77 (ctest
# SKIP_RETURN_CODE) when tmux is missing.
#
#   sh tests/test_top.sh path/to/nofrag
set -u
CLI=${1:?usage: test_top.sh NOFRAG_CLI}

# Without tmux: an option missing its value is a usage error naming it (it
# read "unknown option"), and --clean with --once --json keeps stdout one
# JSON array (its summary line went to stdout before the array).
for opt in --dir --selftest-hold --selftest-exec; do
  msg=$("$CLI" top $opt 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq 2 ] && [ "$msg" = "nofrag top: $opt needs a value" ] ||
    { echo "FAIL: top $opt: exit $rc, '$msg'"; exit 1; }
done
edir=$(mktemp -d /tmp/nf_top_empty_XXXXXX)
cj=$("$CLI" top --once --json --clean --dir "$edir" 2>"$edir.err")
rc=$?
cerr=$(cat "$edir.err")
rm -rf "$edir" "$edir.err"
[ $rc -eq 0 ] && [ "$cj" = "[]" ] || { echo "FAIL: top --once --json --clean: exit $rc, stdout '$cj'"; exit 1; }
[ "$cerr" = "removed 0 files of dead processes; 0 live pools" ] ||
  { echo "FAIL: top --once --json --clean: stderr '$cerr'"; exit 1; }

# The live view into a file or pipe (stdin at EOF: one frame, then out):
# the table without terminal codes (it wrote cursor and clear-screen codes).
edir=$(mktemp -d /tmp/nf_top_pipe_XXXXXX)
"$CLI" top --dir "$edir" </dev/null >"$edir.out" 2>&1
rc=$?
esc=$(printf '\033')
grep -q "$esc" "$edir.out" && { rm -rf "$edir" "$edir.out"; echo "FAIL: top into a file wrote terminal codes"; exit 1; }
grep -q "nofrag top" "$edir.out" || { cat "$edir.out"; rm -rf "$edir" "$edir.out"; echo "FAIL: top into a file: no table"; exit 1; }
rm -rf "$edir" "$edir.out"
[ $rc -eq 0 ] || { echo "FAIL: top into a file: exit $rc"; exit 1; }

command -v tmux >/dev/null 2>&1 || { echo "tmux not installed: skipped"; exit 77; }
: "${TERM:=xterm}"
export TERM
dir=$(mktemp -d /tmp/nf_top_XXXXXX)
out=$dir.hold
sock=nf_top_$$
export NOFRAG_SHM_DIR=$dir
holder=
cleanup() {
  tmux -L "$sock" kill-server 2>/dev/null
  [ -n "$holder" ] && kill "$holder" 2>/dev/null && wait "$holder" 2>/dev/null
  rm -rf "$dir" "$out"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- pane:"; tmux -L "$sock" capture-pane -p -t top 2>/dev/null; exit 1; }

# Poll `cond` (a shell command) up to $2 tenths of a second.
wait_for() {
  i=0
  while ! eval "$1"; do
    i=$((i + 1))
    [ "$i" -ge "$2" ] && return 1
    sleep 0.1
  done
}

"$CLI" top --selftest-hold 60 >"$out" 2>&1 &
holder=$!
wait_for 'grep -q "^ready" "$out"' 100 || fail "holder did not start: $(cat "$out")"
pid=$(sed -n 's/^ready //p' "$out")
[ "$pid" = "$holder" ] || fail "holder pid $pid != $holder"

tmux -L "$sock" new-session -d -s top -x 160 -y 24 \
  "env NOFRAG_SHM_DIR='$dir' '$CLI' top; echo TOP-EXITED rc=\$?; sleep 60" || fail "tmux new-session"
pane() { tmux -L "$sock" capture-pane -p -t top; }
# The holder's row: its pid, device and 12345678 B = 11.77 MiB live.
wait_for 'pane | grep -Eq "^$pid +0 +host +11\.77M "' 50 || fail "no row for pid $pid with 11.77M live"
pane | grep -q "ALLOC/S" || fail "no header"
# Second frame on: the rate is allocs per second over the refresh (~1000/s; > 0).
sleep 2.2
rate=$(pane | awk -v p="$pid" '$1 == p { print $12 }')
[ -n "$rate" ] && [ "$rate" -gt 0 ] || fail "allocation rate '$rate'"
tmux -L "$sock" send-keys -t top q
wait_for 'pane | grep -q "TOP-EXITED rc=0"' 50 || fail "q did not quit top"

# A reader that goes away (| head): top must still give the terminal back
# (canonical mode, echo). SIGPIPE killed it in no-echo mode before.
tmux -L "$sock" new-window -d -n pipe \
  "env NOFRAG_SHM_DIR='$dir' '$CLI' top | head -c 10 >/dev/null; s=\$(stty -a); \
   case \"\$s\" in *-icanon*|*-echo\ *) echo TTY-RAW;; *) echo TTY-COOKED;; esac; sleep 60" ||
  fail "tmux new-window"
ppane() { tmux -L "$sock" capture-pane -p -t top:pipe; }
wait_for 'ppane | grep -q "TTY-"' 50 || fail "top | head did not end: $(ppane)"
ppane | grep -q "TTY-COOKED" || fail "top | head left the terminal raw: $(ppane)"

json=$("$CLI" top --once --json) || fail "top --once --json"
echo "$json" | grep -q "\"pid\": $pid, " || fail "json lacks pid: $json"
# The holder's churn (an alloc + free per tick) can be caught between the two,
# 4 KiB above its steady live bytes: poll, as for the pane above.
wait_for 'json=$("$CLI" top --once --json) && echo "$json" | grep -q "\"live\": 12345678,"' 50 ||
  fail "json lacks live: $json"
if command -v python3 >/dev/null 2>&1; then
  echo "$json" | python3 -c 'import json,sys; a=json.load(sys.stdin); assert len(a)==1 and a[0]["live"]==12345678' ||
    fail "json does not parse: $json"
fi

# SIGTERM: the holder destroys its pool at exit and its file goes away.
kill "$holder"
wait "$holder"
holder=
[ -z "$(ls -A "$dir")" ] || fail "files left: $(ls -A "$dir")"
"$CLI" top --once | grep -q "no nofrag pools" || fail "top --once with no pools"
# A process that exec()s keeps its pid and start time but not its pools: once
# the holder has exec'd sleep, top shows no pool (not a live one with frozen
# figures) and --clean removes its file.
"$CLI" top --selftest-exec 60 >"$out" 2>&1 &
holder=$!
wait_for '[ "$(cat /proc/$holder/comm 2>/dev/null)" = sleep ]' 100 || fail "exec holder: $(cat "$out")"
grep -q "^ready $holder" "$out" || fail "exec holder: $(cat "$out")"
[ -n "$(ls -A "$dir")" ] || fail "the exec'd holder left no file"
# (polled: the exec lets go of the old image's mapping a moment after the switch)
wait_for '"$CLI" top --once | grep -q "no nofrag pools"' 50 ||
  fail "top shows the exec'd holder's pool: $("$CLI" top --once)"
clean=$("$CLI" top --clean)
[ "$clean" = "removed 1 file of dead processes; 0 live pools" ] || fail "--clean: $clean"
[ -z "$(ls -A "$dir")" ] || fail "files left after --clean: $(ls -A "$dir")"
echo "test_top: ok (pid $pid, rate $rate/s)"
