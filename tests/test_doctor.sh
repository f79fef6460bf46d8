#!/bin/sh
# `nofrag doctor`: its verdicts on this machine and, through a stand-in
# libcuda.so.1 (tests/fake_cuda, its answers set by NF_FAKE_CUDA), on the
# driver situations a GPU machine can be in: no device, an old driver, a GPU
# without VMM or IPC handles, no peer paths, a driver the library's backend
# cannot load. Also bad options and NOFRAG_CONF, and --json agreeing with
# the exit status.
#
#   sh tests/test_doctor.sh path/to/nofrag path/to/dir-with-fake-libcuda.so.1
set -u
CLI=${1:?usage: test_doctor.sh NOFRAG_CLI FAKE_CUDA_DIR}
FAKE=${2:?usage: test_doctor.sh NOFRAG_CLI FAKE_CUDA_DIR}
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# has JSON NAME STATUS [TEXT]: the check NAME has STATUS (and its detail TEXT).
has() {
  printf '%s' "$1" | grep -q "{\"name\": \"$2\", \"status\": \"$3\", \"detail\": \"[^\"]*${4:-}" ||
    bad "expected $2=$3${4:+ with '$4'} in: $1"
}
# run ENV...: the doctor's JSON with the fake driver and ENV; $rc its status.
run() { out=$(env LD_LIBRARY_PATH="$FAKE" "$@" "$CLI" doctor --json); rc=$?; }

# Usage errors change nothing and say what is wrong.
for args in "--device" "--device x" "--device -1" "--device 1024" "--bogus"; do
  # shellcheck disable=SC2086
  msg=$("$CLI" doctor $args 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && [ -n "$msg" ] || bad "doctor $args: exit $rc, '$msg'"
done
"$CLI" doctor --device 2>&1 | grep -q "^nofrag doctor: --device needs a value" || bad "--device without a value"
"$CLI" doctor --help | grep -q "usage: nofrag doctor" || bad "--help"

# This machine's own driver, if any: the host checks pass whatever it is.
out=$("$CLI" doctor --json); rc=$?
has "$out" library ok "host backend"
printf '%s' "$out" | grep -q "\"failed\": 0" && [ $rc -eq 0 ] ||
  { printf '%s' "$out" | grep -q "\"status\": \"fail\"" && [ $rc -eq 1 ]; } || bad "exit $rc disagrees with: $out"

# A driver without devices.
run NF_FAKE_CUDA=init=100
has "$out" driver fail "CUDA_ERROR_NO_DEVICE"
[ $rc -eq 1 ] || bad "no device: exit $rc"

# Two GPUs that work (the stand-in's VMM on host memory): every check passes,
# the round trip and the spill through the driver included.
run NF_FAKE_CUDA=devices=2
has "$out" driver ok "CUDA driver API 13.0, 2 device(s)"
has "$out" cuda:0 ok "a block over 3 granules of 2.000 MiB mapped, written, read back"
has "$out" "cuda:0 spill" ok "spill:host works"
has "$out" "cuda:1 ipc" ok
has "$out" peers ok 'peer access: 0-\\u003e1 1-\\u003e0'
printf '%s' "$out" | grep -q "\"failed\": 0" && [ $rc -eq 0 ] || bad "two working GPUs: exit $rc, $out"

# Two GPUs: cuda:1 without VMM, cuda:0 without fd handles, no peer path;
# cuda:0 says it has VMM but the driver refuses its allocations: the pool cannot be made.
run NF_FAKE_CUDA=devices=2,vmm1=0,fd0=0,peer=0,broken0=1
has "$out" driver ok "CUDA driver API 13.0, 2 device(s)"
has "$out" cuda:0 fail "cuMemGetAllocationGranularity(device): CUDA_ERROR_NOT_SUPPORTED"
has "$out" "cuda:0 ipc" warn "no POSIX fd handles"
has "$out" cuda:1 fail "no virtual memory management"
has "$out" peers warn 'no peer access: 0-\\u003e1 1-\\u003e0' # (JSON escapes '>')
printf '%s' "$out" | grep -q "\"failed\": 2" && [ $rc -eq 1 ] || bad "two failures expected: exit $rc, $out"

# --device picks one GPU (no peer check); past the last one is a failure.
out=$(env LD_LIBRARY_PATH="$FAKE" NF_FAKE_CUDA=devices=2,vmm1=0 "$CLI" doctor --json --device 1); rc=$?
has "$out" cuda:1 fail "no virtual memory management"
printf '%s' "$out" | grep -q "\"cuda:0\"\|\"peers\"" && bad "--device 1 checked other devices: $out"
out=$(env LD_LIBRARY_PATH="$FAKE" NF_FAKE_CUDA=devices=2 "$CLI" doctor --json --device 5); rc=$?
has "$out" driver fail "--device 5: the driver sees 2 device(s)"

# An old driver is a warning, with peers found.
run NF_FAKE_CUDA=version=11040,devices=2
has "$out" driver warn "CUDA driver API 11.4"
has "$out" peers ok 'peer access: 0-\\u003e1 1-\\u003e0'

# NOFRAG_CONF: malformed fails with the parser's message; valid is shown.
out=$(NOFRAG_CONF="limit:12XB" "$CLI" doctor --json); rc=$?
has "$out" config fail "limit:12XB"
[ $rc -eq 1 ] || bad "malformed NOFRAG_CONF: exit $rc"
out=$(NOFRAG_CONF="limit:24GiB" "$CLI" doctor --json)
has "$out" config ok "limit:25769803776"
# Whole, however long: the list of valid keys, and a configuration echoed back.
out=$(NOFRAG_CONF="bogus:1" "$CLI" doctor --json)
has "$out" config fail "units, edges)"
long=/tmp/$(printf '%0200d' 0)
out=$(NOFRAG_CONF="trace:$long.csv,offload_dir:$long,limit:1GiB" "$CLI" doctor --json)
has "$out" config ok "offload_dir:$long"

# The text form: one line per check, and the same verdict.
txt=$(env LD_LIBRARY_PATH="$FAKE" NF_FAKE_CUDA=init=100 "$CLI" doctor); rc=$?
printf '%s\n' "$txt" | grep -q "^  fail  driver" && printf '%s\n' "$txt" | grep -q "1 check(s) failed." &&
  [ $rc -eq 1 ] || bad "text form: $txt"

[ $fails -eq 0 ] && echo "test_doctor: all passed" && exit 0
echo "test_doctor: $fails failure(s)"
exit 1
