#!/usr/bin/env bash
# `megatron doctor` on CPU ranks: one process and 2 ranks under mpirun pass every check (MPI named,
# the all-reduce correct with its bus bandwidth, --save writable and shared); a --save that cannot
# be created fails, exit 1, saying why.
# With DEVICE=cuda (the multigpu label), one rank per visible GPU instead: every check passes, the
# all-reduce on NCCL.
# usage: [DEVICE=cuda] doctor_test.sh MEGATRON MPIRUN [MPIRUN FLAGS...]
set -u
megatron=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
if [ "${DEVICE:-cpu}" = cuda ]; then
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  timeout -k 5 120 "$@" -np "$gpus" "$megatron" doctor --device cuda --save "$dir/ckpt" --all-reduce-mib 256 \
    >"$dir/gpus.log" 2>&1
  rc=$?
  cat "$dir/gpus.log"
  [ "$rc" -eq 0 ] || fail "doctor on $gpus GPUs exited $rc"
  grep -q "all-reduce of 256 MiB over $gpus rank(s) (\(NCCL\|one process\)): correct" "$dir/gpus.log" ||
    fail "no all-reduce line"
  grep -q 'all checks passed' "$dir/gpus.log" || fail "no verdict"
  echo "PASS on $gpus GPUs"
  exit 0
fi
"$megatron" doctor --device cpu --save "$dir/ckpt" --all-reduce-mib 4 >"$dir/one.log" 2>&1 ||
  fail "one process: $(cat "$dir/one.log")"
cat "$dir/one.log"
grep -q '^\[ok\]   rank 0: all-reduce of 4 MiB over 1 rank(s) (one process): correct' "$dir/one.log" || fail "no all-reduce line"
grep -q 'all checks passed' "$dir/one.log" || fail "no verdict"

timeout -k 5 60 "$@" -np 2 "$megatron" doctor --device cpu --save "$dir/ckpt" --all-reduce-mib 4 >"$dir/two.log" 2>&1 ||
  fail "2 ranks: $(cat "$dir/two.log")"
cat "$dir/two.log"
for line in '^\[ok\]   rank 0: launcher: Open MPI, rank 0 of 2' '^\[ok\]   all ranks: MPI: Open MPI' \
  '^\[ok\]   all ranks: all-reduce of 4 MiB over 2 rank(s) (MPI): correct, [0-9.]* ms, bus bandwidth [0-9.]* GB/s' \
  "^\[ok\]   all ranks: --save $dir/ckpt: writable, shared, [0-9.]* GiB free" 'all checks passed'; do
  grep -q "$line" "$dir/two.log" || fail "2 ranks: no line matching $line"
done
[ -z "$(ls -A "$dir/ckpt")" ] || fail "doctor left files in --save: $(ls -A "$dir/ckpt")"

"$megatron" doctor --device cpu --save /proc/megatron-doctor --all-reduce-mib 1 >"$dir/bad.log" 2>&1
rc=$?
cat "$dir/bad.log"
[ "$rc" -eq 1 ] || fail "an unusable --save exited $rc, not 1"
grep -q '^\[FAIL\] rank 0: --save /proc/megatron-doctor cannot be created' "$dir/bad.log" || fail "no FAIL line"
echo "PASS"
