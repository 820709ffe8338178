#!/usr/bin/env bash
# Expert parallelism beside data parallelism on the same GPUs: megatron-cpp trains an MoE preset
# (default moe-1b-8x: llama-1b attention, 8 experts, top-2) on the node's N GPUs ($GPUS, default
# every visible GPU) as
#   DP = N, EP = 1                                (every GPU holds every expert: the baseline),
#   EP = 2, 4, 8 (those dividing N and the experts), x expert DP = N / EP,
#     with --moe-token-dispatcher-type allgather and alltoall,
# each with --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather, bf16 over fp32
# master weights, --moe-grouped-gemm, dropless routing, no dropout, mock data, 30 iterations timed
# over the log's last interval (11-30), as bench_dp.sh.
#
# Same work per GPU: EP splits the experts, not the data, so every layout keeps --micro-batch-size
# MBS and --global-batch-size N x MBS (one micro-batch per GPU per step) and trains the same tokens
# per step: tokens/s per GPU compare directly, and the ratio to EP = 1 is what the token exchange
# costs against the smaller expert weights and optimizer state each GPU holds (the peak memory
# column). The allgather dispatcher moves every token of the EP group to every EP rank; alltoall
# moves each token to its k experts' ranks only (variable split sizes).
#
# Prints one markdown table, a row as soon as its run is done (a run cut short by a time limit
# still leaves the rows before it); every run's log is appended to $OUT/bench-ep-logs.txt.
# Usage: bench/bench_ep.sh [build_dir] [preset:micro_batch ...]   (default: moe-1b-8x:4)
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/gpu}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(moe-1b-8x:4)
gpus="${GPUS:-$(nvidia-smi -L | wc -l)}"
[ "$gpus" -ge 2 ] || { echo "bench_ep.sh: $gpus GPU(s) visible; expert parallelism needs 2 or more" >&2; exit 2; }
out="${OUT:-/tmp/bench-ep}"
mkdir -p "$out"
work="$(mktemp -d /tmp/bench-ep.XXXXXX)"
logs="$out/bench-ep-logs.txt"
: > "$logs"
export NCCL_NVLS_ENABLE=0  # never NVLink multicast (shared machines); mpirun passes it on with -x
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
iters=30 log_interval=10
experts=8  # of the default preset; a preset with other counts skips the EP sizes that do not divide them

source bench/train_runs.sh  # field, num, finish_run, ours, read_ours

echo
echo "$(date -u +%F) ${gpus}x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); bf16, global batch = GPUs x micro-batch in every layout"
echo "| preset | layout | GPUs | ms/it | tokens/s per GPU | ratio to EP 1 per GPU | TFLOP/s/GPU | peak memory GiB | optimizer state GiB/GPU | lm loss (it 30) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
rc=0
for run in "${runs[@]}"; do
  preset="${run%%:*}" mbs="${run##*:}"
  base_tok=""
  for variant in 1 2-allgather 2-alltoall 4-allgather 4-alltoall 8-allgather 8-alltoall; do
    ep=${variant%%-*}
    [ $((gpus % ep)) -eq 0 ] && [ $((experts % ep)) -eq 0 ] || continue
    flags=(--expert-model-parallel-size "$ep" --moe-grouped-gemm --use-distributed-optimizer --overlap-grad-reduce
      --overlap-param-gather)
    layout="DP $gpus"
    if [ "$ep" -gt 1 ]; then
      dispatcher=${variant#*-}
      flags+=(--moe-token-dispatcher-type "$dispatcher")
      layout="EP $ep x expert DP $((gpus / ep)), $dispatcher"
    fi
    name="ours-$preset-ep$variant"
    ours "$name" "$gpus" "$preset" "$mbs" "${flags[@]}"
    read_ours "$name" "$gpus"
    [ -n "$ms" ] || rc=1  # the run failed: its row shows "-"
    loss=$(grep '"kind":"train"' "$work/$name.jsonl" 2>/dev/null | tail -1 | field lm_loss)
    [ "$ep" -eq 1 ] && base_tok=$tok
    ratio=$(awk -v a="$tok" -v b="$base_tok" 'BEGIN { if (a > 0 && b > 0) printf "%.1f%%", 100 * a / b; else print "-" }')
    [ "$ep" -eq 1 ] && ratio="(base)"
    echo "| $preset (mbs $mbs) | $layout | $gpus | $(num "$ms" %.1f) | $(num "$tok" %.0f) | $ratio | $(num "$tf" %.1f) | $(num "$peak" %.2f) | $(num "$opt" %.2f) | $(num "$loss" %.4f) |"
  done
done
exit $rc
