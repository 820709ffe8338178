#!/usr/bin/env bash
# Megatron FSDP against the distributed optimizer on one node: megatron-cpp at DP = $GPUS (mpirun,
# bf16, overlapped gradient reduction) with --use-distributed-optimizer --overlap-param-gather
# (ZeRO-1: optimizer state sharded) beside --use-megatron-fsdp with
# --data-parallel-sharding-strategy optim_grads (ZeRO-2: gradients sharded too) and
# optim_grads_params (ZeRO-3: parameters sharded too, each layer all-gathered for its forward and
# again for its backward, the next one prefetched). Same model, per-GPU micro-batch and global
# batch (GPUs x micro-batch) in every run, so
#   FSDP cost = ms/it with FSDP - ms/it with the distributed optimizer (the gathers overlap did not hide),
#   memory saved = peak memory and weights + gradients held per GPU, read from each run's log
#     (beside the peak `megatron plan` predicts for the same command line).
# Prints one markdown table, a row as soon as its run is done; every run's log is appended to
# $OUT/bench-fsdp-logs.txt.
# Usage: bench/bench_fsdp.sh [build_dir] [preset:micro_batch ...]   (default: llama-3b:4)
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/gpu}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(llama-3b:4)
gpus="${GPUS:-4}"
out="${OUT:-/tmp/bench-fsdp}"
mkdir -p "$out"
work="$(mktemp -d /tmp/bench-fsdp.XXXXXX)"
logs="$out/bench-fsdp-logs.txt"
: > "$logs"
export NCCL_NVLS_ENABLE=0  # never NVLink multicast (shared machines); mpirun passes it on with -x
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
iters=30 log_interval=10  # as bench_dp.sh: iterations 1-10 warm up, the last interval (11-30) is measured

source bench/train_runs.sh  # field, num, finish_run, ours, read_ours, read_plan

# Sets held: the weights and main gradients a rank holds between steps, GiB (the log's line).
read_held() {
  held=$(sed -nE 's/.*> weights and main gradients: ([0-9.]+) MiB and ([0-9.]+) MiB held per rank.*/\1 \2/p' \
    "$work/$1.log" | head -1 | awk '{ if ($1 != "") printf "%.2f + %.2f", $1 / 1024, $2 / 1024 }')
}

# row PRESET LABEL BASE_MS: one table line from ms tok tf peak plan opt held; a run that left no
# figures (it failed: its row shows "-") makes the script exit 1.
row() {
  local cost
  [ -n "$ms" ] || rc=1
  cost=$(awk -v a="$ms" -v b="$3" 'BEGIN { if (a > 0 && b > 0) printf "%+.1f", a - b; else print "-" }')
  echo "| $1 | $2 | $(num "$ms" %.1f) | $cost | $(num "$tok" %.0f) | $(num "$tf" %.1f) | $(num "$peak" %.2f) | $(num "$plan" %.2f) | ${held:--} | $(num "$opt" %.2f) |"
}

echo
echo "$(date -u +%F) ${gpus}x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); bf16, DP $gpus, global batch = GPUs x micro-batch"
echo "| preset | config | ms/it | vs distributed optimizer ms/it | tokens/s per GPU | TFLOP/s/GPU | peak memory GiB | plan GiB | weights + grads held GiB/GPU | optimizer state GiB/GPU |"
echo "|---|---|---|---|---|---|---|---|---|---|"
rc=0
for run in "${runs[@]}"; do
  preset="${run%%:*}" mbs="${run##*:}"
  distopt=(--overlap-grad-reduce --use-distributed-optimizer --overlap-param-gather)
  ours "ours-$preset-distopt" "$gpus" "$preset" "$mbs" "${distopt[@]}"
  read_ours "ours-$preset-distopt" "$gpus"
  read_plan "$gpus" "$preset" "$mbs" "${distopt[@]}"
  read_held "ours-$preset-distopt"
  base_ms=$ms
  row "$preset (mbs $mbs)" "--use-distributed-optimizer --overlap-param-gather" "$base_ms"
  for strategy in optim_grads optim_grads_params; do
    fsdp=("${distopt[@]}" --use-megatron-fsdp --data-parallel-sharding-strategy "$strategy")
    ours "ours-$preset-$strategy" "$gpus" "$preset" "$mbs" "${fsdp[@]}"
    read_ours "ours-$preset-$strategy" "$gpus"
    read_plan "$gpus" "$preset" "$mbs" "${fsdp[@]}"
    read_held "ours-$preset-$strategy"
    row "$preset (mbs $mbs)" "--use-megatron-fsdp --data-parallel-sharding-strategy $strategy" "$base_ms"
  done
done
exit $rc
