#!/usr/bin/env bash
# Preemption and time limits of `megatron train` (training/exit_conditions.h), one process:
#  1. --exit-signal-handler: SIGTERM mid-run finishes the step, saves, exits 0; with
#     --save-interval 2 --keep-last-checkpoints 2 only the two newest checkpoints remain;
#  2. the run resumed from that checkpoint stops at --exit-interval (exit 0, a checkpoint there);
#  3. local non-persistent checkpoints: a run killed (-9) after one resumes from it (newer than
#     --load's, which holds none), keeping only the newest per rank;
#  then a run that was never stopped gives the same loss and grad norm at every iteration, bit for
#  bit (the metrics file holds them at full precision), so stopping and resuming lost nothing;
#  4. --exit-duration-in-mins stops a run and saves where it stopped.
# usage: exit_conditions_test.sh MEGATRON
set -u
megatron=$1
dir=$(mktemp -d)
job=
cleanup() {
  [ -n "$job" ] && kill -KILL "$job" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# Dropout on and a schedule pinned by --lr-decay-iters, so every piece of state must survive.
model=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
  --global-batch-size 4 --lr 1e-3 --lr-decay-style cosine --lr-warmup-iters 3 --lr-decay-iters 40
  --attention-dropout 0.1 --hidden-dropout 0.1 --mock-data --tokenizer-type NullTokenizer --vocab-size 100
  --device cpu --log-interval 1 --train-iters 100000)
tracker() { cat "$1/latest_checkpointed_iteration.txt" 2>/dev/null; }
last_iteration() { tail -n 1 "$1" | grep -o '"iteration":[0-9]*' | cut -d: -f2; }
# "iteration lm_loss grad_norm" per line, the numbers as the metrics file prints them (17 digits).
curve() { sed -E 's/.*"grad_norm":([^,]*),.*"iteration":([0-9]*),.*"lm_loss":([^,]*),.*/\2 \3 \1/' "$@"; }

# 1. SIGTERM once three iterations are logged.
"$megatron" train "${model[@]}" --exit-signal-handler --save "$dir/ckpt" --save-interval 2 \
  --keep-last-checkpoints 2 --metrics-file "$dir/preempted.jsonl" >"$dir/preempted.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ "$(wc -l <"$dir/preempted.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
kill -TERM "$job" || fail "the run ended before SIGTERM: $(cat "$dir/preempted.log")"
wait "$job"
rc=$?
job=
cat "$dir/preempted.log"
[ "$rc" -eq 0 ] || fail "the preempted run exited $rc, not 0"
grep -q 'exiting program after receiving SIGTERM\.' "$dir/preempted.log" || fail "no 'exiting program' line"
stopped=$(last_iteration "$dir/preempted.jsonl")
[ "$(tracker "$dir/ckpt")" = "$stopped" ] || fail "the tracker names $(tracker "$dir/ckpt"), not the last step $stopped"
kept=$(cd "$dir/ckpt" && ls -d iter_* | tr '\n' ' ')
[ "$(echo "$kept" | wc -w)" -eq 2 ] || fail "--keep-last-checkpoints 2 left $kept"
echo "preempted at iteration $stopped; kept $kept"

# 2. Resume and stop at --exit-interval.
until_iteration=$((stopped + 4))
"$megatron" train "${model[@]}" --load "$dir/ckpt" --save "$dir/ckpt" --save-interval 1000 \
  --exit-interval "$until_iteration" --metrics-file "$dir/resumed.jsonl" >"$dir/resumed.log" 2>&1 ||
  fail "the resumed run failed: $(cat "$dir/resumed.log")"
grep -q "exiting program at iteration $until_iteration" "$dir/resumed.log" || fail "no exit at $until_iteration"
[ "$(tracker "$dir/ckpt")" = "$until_iteration" ] || fail "no checkpoint saved at the exit interval"
grep -q 'on validation set\|on test set' "$dir/resumed.log" && fail "an early exit must skip the final evaluations"

# 3. Local non-persistent checkpoints every 2 iterations, the run killed (-9) once one exists; the
# resumed run loads the newest (there is no persistent one), saves the next local one (removing the
# older) and stops 4 iterations later.
local=(--non-persistent-save-interval 2 --non-persistent-ckpt-type local --non-persistent-local-ckpt-dir "$dir/local")
"$megatron" train "${model[@]}" "${local[@]}" --save "$dir/persistent" --save-interval 1000 \
  >"$dir/killed.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ -n "$(tracker "$dir/local/rank_00000")" ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.05
done
kill -KILL "$job" || fail "the run ended before it was killed: $(cat "$dir/killed.log")"
wait "$job" 2>/dev/null
job=
held=$(tracker "$dir/local/rank_00000")
[ -n "$held" ] || fail "no local checkpoint was written: $(cat "$dir/killed.log")"
local_until=$((held + 4))
"$megatron" train "${model[@]}" "${local[@]}" --load "$dir/persistent" --save "$dir/persistent" --save-interval 1000 \
  --exit-interval "$local_until" --metrics-file "$dir/local.jsonl" >"$dir/local.log" 2>&1 ||
  fail "resuming from the local checkpoint failed: $(cat "$dir/local.log")"
grep -q "loaded local checkpoint from $dir/local at iteration $held" "$dir/local.log" ||
  fail "the local checkpoint of iteration $held was not loaded: $(cat "$dir/local.log")"
local_kept=$(cd "$dir/local/rank_00000" && ls -d iter_*)
[ "$local_kept" = "$(printf 'iter_%07d' $((held + 2)))" ] || fail "local checkpoints kept: $local_kept, not the newest"

# The same iterations without a stop: every curve above is a piece of it.
final=$((until_iteration > local_until ? until_iteration : local_until))
"$megatron" train "${model[@]}" --exit-interval "$final" --metrics-file "$dir/straight.jsonl" \
  >"$dir/straight.log" 2>&1 || fail "the uninterrupted run failed: $(cat "$dir/straight.log")"
curve "$dir/straight.jsonl" >"$dir/straight.curve"
[ "$(wc -l <"$dir/straight.curve")" -eq "$final" ] || fail "the uninterrupted run logged $(wc -l <"$dir/straight.curve") iterations"
curve "$dir/preempted.jsonl" "$dir/resumed.jsonl" >"$dir/stopped.curve"
head -n "$until_iteration" "$dir/straight.curve" | diff - "$dir/stopped.curve" ||
  fail "the stopped and resumed curve differs from the uninterrupted one"
curve "$dir/local.jsonl" | diff <(sed -n "$((held + 1)),${local_until}p" "$dir/straight.curve") - ||
  fail "the curve resumed from the local checkpoint differs from the uninterrupted one"

# 4. A time limit of 0.3 s.
"$megatron" train "${model[@]}" --exit-duration-in-mins 0.005 --save "$dir/timed" --save-interval 1000 \
  --metrics-file "$dir/timed.jsonl" >"$dir/timed.log" 2>&1 || fail "the timed run failed: $(cat "$dir/timed.log")"
grep -q 'exiting program after [0-9.e-]* minutes' "$dir/timed.log" || fail "no 'exiting program after ... minutes'"
[ "$(tracker "$dir/timed")" = "$(last_iteration "$dir/timed.jsonl")" ] || fail "the timed run did not save where it stopped"
echo "PASS: SIGTERM at $stopped, resumed to $until_iteration; killed with a local checkpoint of $held, resumed to" \
  "$local_until; both bit for bit; time limit at $(tracker "$dir/timed")"
