#!/usr/bin/env bash
# --optimizer-cpu-offload on CPU ranks: the offloaded state is updated by the same AdamW op on the
# same values as without offload (on the CPU backend the "host" buffers are separate CPU buffers and
# the same code path runs), so every run below must equal its run without offload bit for bit: the
# model weights saved at the last iteration (cmp of the safetensors files) and every iteration's
# loss and grad norm (as the metrics file prints them, 17 significant digits). Cases: one rank f32
# (whole state offloaded, and half of it), bf16 with 30%, the distributed optimizer at DP=2 in bf16
# (all, and 40% of each rank's shard), and a checkpoint saved with offload at iteration 2 resumed
# without it (the f32 master is rebuilt from the saved weights).
# usage: optimizer_offload_test.sh MEGATRON MPIRUN [MPIRUN FLAGS...]
base="--model-preset llama-tiny --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --log-interval 1 --device cpu
  --mock-data --tokenizer-type NullTokenizer --vocab-size 1000 --save-interval 2"
source "$(dirname "$0")/cpu_training_runs.sh"
curve() { grep -o '"\(lm_loss\|grad_norm\)": *[^,}]*' "$1" | tr '\n' ' '; }
same() {  # reference run, offloaded run
  local a=$1 b=$2 why=""
  [ "$(curve "$dir/$a.jsonl")" == "$(curve "$dir/$b.jsonl")" ] || why="loss or grad-norm curves differ"
  same_weights "$a" "$b" 4 || why="$why weights of iteration 4 differ"
  grep -q 'optimizer CPU offload' "$dir/$b.log" || why="$why (the run did not offload)"
  if [ -n "$why" ]; then
    echo "FAIL: $b against $a: $why"
    status=1
  else
    echo "ok: $b equals $a bit for bit ($(curve "$dir/$b.jsonl" | cut -c1-60)...)"
  fi
}
run f32 1 --train-iters 4
run f32_offload 1 --train-iters 4 --optimizer-cpu-offload
run f32_offload_half 1 --train-iters 4 --optimizer-cpu-offload --optimizer-offload-fraction 0.5
same f32 f32_offload
same f32 f32_offload_half
run bf16 1 --train-iters 4 --bf16
run bf16_offload 1 --train-iters 4 --bf16 --optimizer-cpu-offload --optimizer-offload-fraction 0.3
same bf16 bf16_offload
run dist 2 --train-iters 4 --bf16 --use-distributed-optimizer
run dist_offload 2 --train-iters 4 --bf16 --use-distributed-optimizer --optimizer-cpu-offload
run dist_offload_part 2 --train-iters 4 --bf16 --use-distributed-optimizer --optimizer-cpu-offload \
  --optimizer-offload-fraction 0.4
same dist dist_offload
same dist dist_offload_part
# Saved with offload at iteration 2 (--exit-interval stops the run there), resumed without it to 4.
run resumed 1 --train-iters 4 --exit-interval 2 --optimizer-cpu-offload
run resumed 1 --train-iters 4 --load "$dir/resumed"
if same_weights f32 resumed 4; then
  echo "ok: saved with offload, resumed without: the weights of iteration 4 equal the uninterrupted run's"
else
  echo "FAIL: saved with offload, resumed without: the weights of iteration 4 differ"
  status=1
fi
exit $status
