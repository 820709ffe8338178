#!/usr/bin/env bash
# Local non-persistent checkpoints under mpirun (DP=2, distributed optimizer): each rank writes
# its own under DIR/rank_RRRRR; resumed at DP=2 every rank loads its own (no persistent checkpoint exists) and the curve from there equals
# an uninterrupted run's, bit for bit; resumed at DP=1 (another layout) the run loads --load's
# checkpoint instead.
# usage: local_checkpoint_test.sh MEGATRON MPIRUN [MPIRUN FLAGS...]
set -u
megatron=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
model=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
  --global-batch-size 4 --lr 1e-3 --lr-decay-iters 40 --mock-data --tokenizer-type NullTokenizer --vocab-size 100
  --device cpu --log-interval 1 --train-iters 100000 --use-distributed-optimizer --distributed-timeout-minutes 0.5
  --non-persistent-save-interval 2 --non-persistent-ckpt-type local
  --non-persistent-local-ckpt-dir "$dir/local")
tracker() { cat "$1/latest_checkpointed_iteration.txt" 2>/dev/null; }
curve() { sed -E 's/.*"grad_norm":([^,]*),.*"iteration":([0-9]*),.*"lm_loss":([^,]*),.*/\2 \3 \1/' "$@"; }

# Stopped at iteration 5 by --exit-interval without --save: the local checkpoints of iteration 4
# are all there is. (Killing the job at a moment both ranks hold the same one is left to chance:
# the ranks save without a collective; one process killed with -9 is tests/e2e/exit_conditions_test.sh.)
timeout -k 5 60 "$@" -np 2 "$megatron" train "${model[@]}" --exit-interval 5 --metrics-file "$dir/first.jsonl" \
  >"$dir/first.log" 2>&1 || fail "the first run failed: $(cat "$dir/first.log")"
held0=$(tracker "$dir/local/rank_00000")
[ "$held0" = 4 ] && [ "$(tracker "$dir/local/rank_00001")" = 4 ] || fail "the ranks do not both hold iteration 4"
until_iteration=$((held0 + 2))
timeout -k 5 60 "$@" -np 2 "$megatron" train "${model[@]}" --load "$dir/ckpt" --save "$dir/ckpt" --save-interval 1000 \
  --exit-interval "$until_iteration" \
  --metrics-file "$dir/resumed.jsonl" >"$dir/resumed.log" 2>&1 || fail "the resumed run failed: $(cat "$dir/resumed.log")"
grep -q "loaded local checkpoint from $dir/local at iteration $held0" "$dir/resumed.log" ||
  fail "the local checkpoints of iteration $held0 were not loaded: $(cat "$dir/resumed.log")"
straight=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
  --global-batch-size 4 --lr 1e-3 --lr-decay-iters 40 --mock-data --tokenizer-type NullTokenizer --vocab-size 100
  --device cpu --log-interval 1 --train-iters 100000 --use-distributed-optimizer)
timeout -k 5 60 "$@" -np 2 "$megatron" train "${straight[@]}" --exit-interval "$until_iteration" \
  --metrics-file "$dir/straight.jsonl" >"$dir/straight.log" 2>&1 || fail "the uninterrupted run failed"
# DP=2 on CPU ranks reproduces its own curve exactly (the reductions run in a fixed order).
curve "$dir/resumed.jsonl" | diff <(curve "$dir/straight.jsonl" | tail -n 2) - ||
  fail "the curve resumed from the local checkpoints differs from the uninterrupted one"

# One process: another layout, so --load's checkpoint (iteration $until_iteration) is used, saying why.
"$megatron" train "${model[@]}" --load "$dir/ckpt" --exit-interval $((until_iteration + 1)) \
  >"$dir/one.log" 2>&1 || fail "the DP=1 run failed: $(cat "$dir/one.log")"
grep -q "loaded checkpoint from $dir/ckpt at iteration $until_iteration" "$dir/one.log" ||
  fail "the DP=1 run did not load the persistent checkpoint: $(cat "$dir/one.log")"
echo "PASS: resumed from the local checkpoints of iteration $held0 on both ranks, bit for bit"
