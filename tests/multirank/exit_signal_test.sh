#!/usr/bin/env bash
# --exit-signal-handler under mpirun: SIGTERM reaches rank 1 of a 2-rank DP run only (a scheduler
# may signal the ranks at different moments). Every rank must stop after the same iteration (a
# rank that went on would wait in a collective until the watchdog ended the job), the checkpoint
# of that iteration must be published and the job must exit 0; then one process resumes from it.
# usage: exit_signal_test.sh MEGATRON MPIRUN [MPIRUN FLAGS...]
set -u
source "$(dirname "$0")/rank_process.sh"
megatron=$1
shift
dir=$(mktemp -d)
job=
cleanup() {
  [ -n "$job" ] && kill "$job" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
model=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
  --global-batch-size 4 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 100 --device cpu)
timeout -k 5 100 "$@" -np 2 "$megatron" train "${model[@]}" --train-iters 100000 --log-interval 1 \
  --exit-signal-handler --save "$dir/ckpt" --save-interval 100000 --distributed-timeout-minutes 0.2 \
  --metrics-file "$dir/metrics.jsonl" >"$dir/log" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ "$(wc -l <"$dir/metrics.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
victim=$(rank_process "$job" 1)
[ -n "$victim" ] || fail "could not find the process of rank 1: $(cat "$dir/log")"
kill -TERM "$victim"
wait "$job"
rc=$?
job=
cat "$dir/log"
[ "$rc" -eq 0 ] || fail "the job exited $rc, not 0"
grep -q 'exiting program after receiving SIGTERM\.' "$dir/log" || fail "no 'exiting program' line"
stopped=$(tail -n 1 "$dir/metrics.jsonl" | grep -o '"iteration":[0-9]*' | cut -d: -f2)
[ "$(cat "$dir/ckpt/latest_checkpointed_iteration.txt")" = "$stopped" ] || fail "no checkpoint of iteration $stopped"
"$megatron" train "${model[@]}" --train-iters $((stopped + 1)) --log-interval 1 --load "$dir/ckpt" \
  >"$dir/resume.log" 2>&1 || fail "resuming failed: $(cat "$dir/resume.log")"
grep -q "loaded checkpoint from $dir/ckpt at iteration $stopped" "$dir/resume.log" || fail "iteration $stopped not loaded"
echo "PASS: both ranks stopped after iteration $stopped, saved it and exited 0"
