#!/usr/bin/env bash
# Tensor parallelism beside data parallelism on the same GPUs: megatron-cpp trains a preset on the
# node's N GPUs ($GPUS, default every visible GPU) as
#   DP = N                      (TP = 1, the baseline),
#   TP = 2 with --sequence-parallel, x DP = N/2, without and with --tp-comm-overlap,
#   TP = 4 with --sequence-parallel, x DP = N/4, without and with --tp-comm-overlap (where 4 divides N),
# each with --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather where DP > 1
# (at DP = 1 there is nothing to reduce or shard), bf16 over fp32 master weights, no dropout,
# mock data, 30 iterations timed over the log's last interval (11-30), as bench_dp.sh.
#
# Same work per GPU: every layout keeps --micro-batch-size MBS and --global-batch-size N x MBS, as
# a Megatron user who changes only --tensor-model-parallel-size does; Megatron then runs
# GBS / (MBS x DP) = TP micro-batches per step on each replica. The TP ranks of a replica share a
# micro-batch, each computing 1/TP of it, so every GPU does the FLOPs of MBS sequences per step
# (one DP micro-batch) and every layout trains the same tokens per step: tokens/s per GPU and
# TFLOP/s/GPU compare directly, and the ratio to DP is what TP costs (its collectives, as far as
# they are not overlapped with the GEMMs, and GEMMs 1/TP as wide). Under SP a GPU keeps 1/TP of a micro-batch's
# activations, so activation memory per GPU is DP's / TP. (Micro-batch TP x MBS in one step would
# keep DP's GEMM widths and activation memory; Megatron's flags do not lead there.)
# TFLOP/s by Megatron's formula, which counts the padded vocabulary (a multiple of 128 x TP: for
# llama-3b 32000 rows up to TP = 2, 32256 at TP = 4, +0.03% FLOPs).
#
# Prints one markdown table, a row as soon as its run is done (a run cut short by a time limit
# still leaves the rows before it); every run's log is appended to $OUT/bench-tp-logs.txt, with
# the per-op device time of iteration 5 (--profile-ops-iteration: what is left of a step beyond
# its ops is exposed communication and host time).
# Usage: bench/bench_tp.sh [build_dir] [preset:micro_batch ...]   (default: llama-3b:4)
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/gpu}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(llama-3b:4)
gpus="${GPUS:-$(nvidia-smi -L | wc -l)}"
[ "$gpus" -ge 2 ] || { echo "bench_tp.sh: $gpus GPU(s) visible; tensor parallelism needs 2 or more" >&2; exit 2; }
out="${OUT:-/tmp/bench-tp}"
mkdir -p "$out"
work="$(mktemp -d /tmp/bench-tp.XXXXXX)"
logs="$out/bench-tp-logs.txt"
: > "$logs"
export NCCL_NVLS_ENABLE=0  # never NVLink multicast (shared machines); mpirun passes it on with -x
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
iters=30 log_interval=10

source bench/train_runs.sh  # field, num, finish_run, ours, read_ours

echo
echo "$(date -u +%F) ${gpus}x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); bf16, global batch = GPUs x micro-batch in every layout"
echo "| preset | layout | GPUs | ms/it | tokens/s per GPU | ratio to DP per GPU | TFLOP/s/GPU | peak memory GiB | activation memory GiB/GPU (one micro-batch) | lm loss (it 30) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
rc=0
for run in "${runs[@]}"; do
  preset="${run%%:*}" mbs="${run##*:}"
  dp_tok=""
  for variant in 1 2 2-overlap 4 4-overlap; do
    tp=${variant%-overlap}
    [ $((gpus % tp)) -eq 0 ] || continue
    dp=$((gpus / tp))
    flags=(--tensor-model-parallel-size "$tp" --profile-ops-iteration 5)
    layout="DP $dp"
    if [ "$tp" -gt 1 ]; then
      flags+=(--sequence-parallel)
      layout="TP $tp + SP x DP $dp, $tp micro-batches of $mbs per step"
    fi
    if [ "$variant" != "$tp" ]; then
      flags+=(--tp-comm-overlap)
      layout="$layout, --tp-comm-overlap"
    fi
    if [ "$dp" -gt 1 ]; then
      flags+=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
      layout="$layout, dist-opt"
    fi
    name="ours-$preset-tp$variant-dp$dp"
    ours "$name" "$gpus" "$preset" "$mbs" "${flags[@]}"
    read_ours "$name" "$gpus"
    [ -n "$ms" ] || rc=1  # the run failed: its row shows "-"
    loss=$(grep '"kind":"train"' "$work/$name.jsonl" 2>/dev/null | tail -1 | field lm_loss)
    [ "$tp" -eq 1 ] && dp_tok=$tok
    ratio=$(awk -v a="$tok" -v b="$dp_tok" 'BEGIN { if (a > 0 && b > 0) printf "%.1f%%", 100 * a / b; else print "-" }')
    [ "$tp" -eq 1 ] && ratio="(base)"
    echo "| $preset (mbs $mbs) | $layout | $gpus | $(num "$ms" %.1f) | $(num "$tok" %.0f) | $ratio | $(num "$tf" %.1f) | $(num "$peak" %.2f) | $(num "$act" %.2f) | $(num "$loss" %.4f) |"
  done
done
exit $rc
