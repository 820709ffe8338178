#!/usr/bin/env bash
# Pipeline parallelism beside data parallelism on the same GPUs: megatron-cpp trains a preset on
# the node's N GPUs ($GPUS, default every visible GPU) as
#   DP = N                     (PP = 1, the baseline),
#   PP = 2 x DP = N/2, PP = 4 x DP = N/4 (where they divide N), each with 1F1B and interleaved
#   (--num-virtual-stages-per-pipeline-rank $VP, default 2; the preset's layers must divide by PP x VP);
#   interleaved with blocking sends and receives (--no-overlap-p2p-communication): overlapped ones
#   (Megatron's default, also in groups larger than the pipeline) hang on GPUs in this build and
#   are refused there (docs/PERFORMANCE.md, Multi-GPU equivalence runs);
# with --use-distributed-optimizer --overlap-grad-reduce where DP > 1 (each model chunk's buckets
# reduced during the cool-down), bf16, no dropout, mock data, 30 iterations timed over the log's
# last interval (11-30), as bench_dp.sh and bench_tp.sh.
#
# Same work per GPU: every layout keeps --micro-batch-size MBS and --global-batch-size
# N x MBS x ACC ($ACC, default 8), so each DP replica runs ACC x PP micro-batches per step and
# every GPU computes the same tokens; tokens/s per GPU compare directly. The bubble 1F1B leaves is
# (PP-1)/M of the compute with M = ACC x PP micro-batches per replica, interleaved (PP-1)/(M x VP)
# (the schedule simulation of pipeline_parallel/schedule_simulation.h gives the same); the table
# prints it beside the measured bubble, the loss of tokens/s per GPU against DP (1 - ratio), which
# adds the point-to-point transfers and the stages' imbalance (the embedding on the first, the
# output layer and loss on the last).
#
# Prints one markdown table, a row as soon as its run is done; every run's log is appended to
# $OUT/bench-pp-logs.txt.
# Usage: bench/bench_pp.sh [build_dir] [preset:micro_batch ...]   (default: llama-1b:4)
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/gpu}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(llama-1b:4)
gpus="${GPUS:-$(nvidia-smi -L | wc -l)}"
[ "$gpus" -ge 2 ] || { echo "bench_pp.sh: $gpus GPU(s) visible; pipeline parallelism needs 2 or more" >&2; exit 2; }
out="${OUT:-/tmp/bench-pp}"
mkdir -p "$out"
work="$(mktemp -d /tmp/bench-pp.XXXXXX)"
logs="$out/bench-pp-logs.txt"
: > "$logs"
export NCCL_NVLS_ENABLE=0  # never NVLink multicast (shared machines); mpirun passes it on with -x
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
iters=30 log_interval=10
accumulation="${ACC:-8}"
vp="${VP:-2}"

source bench/train_runs.sh  # field, num, finish_run, ours, read_ours

echo
echo "$(date -u +%F) ${gpus}x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); bf16, global batch = GPUs x micro-batch x $accumulation in every layout"
echo "| preset | layout | GPUs | micro-batches per replica | ms/it | tokens/s per GPU | ratio to DP per GPU | schedule's bubble (PP-1)/(M x V) | measured bubble (1 - ratio) | TFLOP/s/GPU | peak memory GiB (last stage) | lm loss (it 30) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
rc=0
for run in "${runs[@]}"; do
  preset="${run%%:*}" mbs="${run##*:}"
  dp_tok=""
  # pp:v; interleaved layouts (v > 1) with blocking sends and receives (header).
  for layout_spec in 1:1 2:1 2:$vp 4:1 4:$vp; do
    IFS=: read -r pp v <<<"$layout_spec"
    [ $((gpus % pp)) -eq 0 ] || continue
    dp=$((gpus / pp)) micro=$((accumulation * pp))
    flags=(--pipeline-model-parallel-size "$pp")
    layout="DP $dp"
    [ "$pp" -gt 1 ] && layout="PP $pp x DP $dp (1F1B)"
    if [ "$v" -gt 1 ]; then
      flags+=(--num-virtual-stages-per-pipeline-rank "$v" --no-overlap-p2p-communication)
      layout="PP $pp x DP $dp (interleaved, $v chunks per rank, p2p blocking)"
    fi
    [ "$dp" -gt 1 ] && flags+=(--use-distributed-optimizer --overlap-grad-reduce) &&
      layout="$layout, dist-opt, overlapped grad reduce"
    name="ours-$preset-pp$pp-v$v-dp$dp"
    ours "$name" "$gpus" "$preset" "$mbs" "${flags[@]}"
    read_ours "$name" "$gpus"
    [ -n "$ms" ] || rc=1  # the run failed: its row shows "-"
    loss=$(grep '"kind":"train"' "$work/$name.jsonl" 2>/dev/null | tail -1 | field lm_loss)
    [ "$pp" -eq 1 ] && dp_tok=$tok
    ratio=$(awk -v a="$tok" -v b="$dp_tok" 'BEGIN { if (a > 0 && b > 0) printf "%.1f%%", 100 * a / b; else print "-" }')
    measured=$(awk -v a="$tok" -v b="$dp_tok" 'BEGIN { if (a > 0 && b > 0) printf "%.1f%%", 100 * (1 - a / b); else print "-" }')
    if [ "$pp" -eq 1 ]; then ratio="(base)" measured="-"; fi
    bubble=$(awk -v p="$pp" -v m="$micro" -v v="$v" 'BEGIN { printf "%.1f%%", 100 * (p - 1) / (m * v) }')
    echo "| $preset (mbs $mbs) | $layout | $gpus | $micro | $(num "$ms" %.1f) | $(num "$tok" %.0f) | $ratio | $bubble | $measured | $(num "$tf" %.1f) | $(num "$peak" %.2f) | $(num "$loss" %.4f) |"
  done
done
exit $rc
