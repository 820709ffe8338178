#!/usr/bin/env bash
# Lost-rank acceptance test: runs lost_rank.cpp on 4 ranks, where rank 2 stops answering or dies
# in step 3, and checks that the job fails (not exit 0), ends well within the guard (no hang), and
# that the output names rank 2 as the missing rank, and no other.
# usage: lost_rank_test.sh stop|exit PROGRAM [--arg PROGRAM_ARG]... MPIRUN [MPIRUN FLAGS...]
set -u
mode=$1
program=$2
shift 2
program_args=()
while [ "${1:-}" = --arg ]; do
  program_args+=("$2")
  shift 2
done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
# In `exit` mode mpirun is told not to end the job when a rank dies (as srun without
# --kill-on-bad-exit), so the watchdog has to notice and name the dead rank.
launcher_flags=()
[ "$mode" = exit ] && launcher_flags=(--mca orte_abort_on_non_zero_status 0)
timeout -k 5 50 "$@" "${launcher_flags[@]}" -np 4 "$program" "$mode" "${program_args[@]}" >"$log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
cat "$log"
fail() {
  echo "FAIL ($mode): $*" >&2
  exit 1
}
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the job hung until the 50 s guard killed it"
[ "$rc" -ne 0 ] || fail "the job exited 0 although rank 2 was lost"
[ "$elapsed" -lt 40 ] || fail "the job took ${elapsed} s to fail; the watchdog timeout is 3 s"
grep -E -q 'missing rank\(s\): 2$' "$log" || fail "no watchdog report names rank 2 as the missing rank"
# Ranks that wait on rank 2 only through others follow the chain of waits to it: no report blames
# a live rank.
others=$(grep -E 'missing rank\(s\):' "$log" | grep -vE 'missing rank\(s\): 2$')
[ -z "$others" ] || fail "a watchdog report names another rank than 2: $others"
echo "PASS ($mode): exit code $rc after ${elapsed} s, rank 2 named"
