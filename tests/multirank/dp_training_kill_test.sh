#!/usr/bin/env bash
# Lost-rank acceptance test of training itself: `megatron train` on 4 ranks (DP=4, distributed
# optimizer, a checkpoint every 2 iterations, --distributed-timeout-minutes 0.1 = 6 s, enough that a loaded
# 2-core machine running 4 ranks does not time out a healthy collective). Once the
# first checkpoint is published, rank 2 is stopped (`stop`: SIGSTOP, a hung process) or killed
# (`kill`: SIGKILL, a dead one). The job must fail (not exit 0) well within the guard, with output
# naming rank 2 and no other rank, and the last published checkpoint must stay loadable: a single
# process resumes from it.
# $LAYOUT_FLAGS, when set, are added to the 4-rank run (PP=4, or EP=4 with experts); the single
# process still resumes, whatever layout saved.
# usage: dp_training_kill_test.sh stop|kill MEGATRON MPIRUN [MPIRUN FLAGS...]
set -u
source "$(dirname "$0")/rank_process.sh"
mode=$1
megatron=$2
shift 2
dir=$(mktemp -d)
job=
cleanup() {
  [ -n "$job" ] && kill "$job" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL ($mode): $*" >&2
  exit 1
}
model=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
  --global-batch-size 8 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 100 --device cpu)
# In `kill` mode mpirun is told not to end the job when a rank dies (as srun without
# --kill-on-bad-exit), so the surviving ranks have to notice and name the dead one.
launcher_flags=()
[ "$mode" = kill ] && launcher_flags=(--mca orte_abort_on_non_zero_status 0)

start=$(date +%s)
guard=60
timeout -k 5 $guard "$@" "${launcher_flags[@]}" -np 4 "$megatron" train "${model[@]}" --train-iters 1000000 \
  --log-interval 1000 --use-distributed-optimizer --save "$dir/ckpt" --save-interval 2 \
  --distributed-timeout-minutes 0.1 ${LAYOUT_FLAGS:-} >"$dir/log" 2>&1 &
job=$!

tracker="$dir/ckpt/latest_checkpointed_iteration.txt"
for _ in $(seq 400); do
  [ -f "$tracker" ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
[ -f "$tracker" ] || {
  cat "$dir/log"
  fail "no checkpoint was published within 40 s"
}

# Rank 2 is the job's descendant whose environment says so.
victim=$(rank_process "$job" 2)
[ -n "$victim" ] || fail "could not find the process of rank 2 among the job's processes"
if [ "$mode" = stop ]; then kill -STOP "$victim"; else kill -KILL "$victim"; fi
echo "rank 2 (pid $victim): sent SIG${mode^^} after checkpoint iteration $(cat "$tracker")"

wait "$job"
rc=$?
job=
elapsed=$(($(date +%s) - start))
cat "$dir/log"
# mpirun's exit code is that of a rank killed by a signal (137 for SIGKILL), so a hang is told
# by the time taken.
[ "$elapsed" -lt $guard ] || fail "the job hung until the $guard s guard killed it"
[ "$rc" -ne 0 ] || fail "the job exited 0 although rank 2 was lost"
[ "$elapsed" -lt 45 ] || fail "the job took ${elapsed} s to fail; the watchdog timeout is 6 s"
grep -E -q 'missing rank\(s\): 2$' "$dir/log" || fail "no watchdog report names rank 2 as the missing rank"
# Ranks that wait on rank 2 only through others (a pipeline's first stage, held in the embedding
# all-reduce by the last) follow the chain of waits to it: no report blames a live rank.
others=$(grep -E 'missing rank\(s\):' "$dir/log" | grep -vE 'missing rank\(s\): 2$')
[ -z "$others" ] || fail "a watchdog report names another rank than 2: $others"

# The last published checkpoint loads (here at DP=1, without the distributed optimizer) and
# training goes on from it.
iteration=$(cat "$tracker")
"$megatron" train "${model[@]}" --train-iters $((iteration + 2)) --log-interval 1 --load "$dir/ckpt" \
  >"$dir/resume.log" 2>&1 || {
  cat "$dir/resume.log"
  fail "resuming from the checkpoint of iteration $iteration failed"
}
grep -q "loaded checkpoint from $dir/ckpt at iteration $iteration" "$dir/resume.log" ||
  fail "the resumed run did not load iteration $iteration"
echo "PASS ($mode): exit code $rc after ${elapsed} s, rank 2 named, iteration $iteration resumed"
