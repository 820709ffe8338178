#!/usr/bin/env bash
# Optimizer CPU offload on one 80 GB GPU: a llama-8b-shaped model (32 layers, hidden 4096, GQA 32/8,
# ffn 14336, vocabulary 128256, sequences of 2048) trained in bf16 with its fp32 master weights and
# Adam moments on the host (--optimizer-cpu-offload) and full activation recomputation, micro-batch
# 1, for a handful of iterations on mock data. The offloaded share is $OFFLOAD_FRACTION (default
# 0.8: plan says 65 GiB on the device and 73 GiB of pinned host memory, which leaves room on a
# 128 GiB host for the initialisation's host copy of the weights; 1.0 needs 91 GiB of host memory).
# Prints what `megatron plan` predicts for the command line (it must say it fits), then the peak
# device memory and tokens/s the run measured. Logs go to $OUT (or /tmp/bench_offload).
# usage: [OFFLOAD_FRACTION=F] bench/bench_offload.sh [build_dir] [extra train flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/gpu}"
shift || true
out="${OUT:-/tmp/bench_offload}"
mkdir -p "$out"
flags=(--model-preset llama-8b --micro-batch-size 1 --global-batch-size 1 --lr 1e-5 --bf16 --mock-data
  --tokenizer-type NullTokenizer --vocab-size 128256 --device cuda --optimizer-cpu-offload
  --optimizer-offload-fraction "${OFFLOAD_FRACTION:-0.8}"
  --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "$@")
"$build/megatron" plan --plan-device-memory-gib 79 "${flags[@]}" --train-iters 6 | tee "$out/plan.txt" |
  grep -v 'activations per layer'
grep -q '^fits' "$out/plan.txt" || { echo "FAIL: megatron plan says the run does not fit 79 GiB"; exit 1; }
rm -f "$out/metrics.jsonl"
timer=()  # the host's peak resident memory, where GNU time exists
[ -x /usr/bin/time ] && timer=(/usr/bin/time -v)
"${timer[@]}" "$build/megatron" train "${flags[@]}" --train-iters 6 --log-interval 1 \
  --metrics-file "$out/metrics.jsonl" >"$out/train.log" 2>&1
rc=$?
grep -E 'optimizer (state|CPU offload)|iteration +[0-9]+/' "$out/train.log" | cut -c1-400
grep -E 'Maximum resident set size' "$out/train.log"
[ $rc -eq 0 ] || { tail -20 "$out/train.log"; echo "FAIL: training exited $rc"; exit 1; }
last=$(grep '"kind":"train"' "$out/metrics.jsonl" | tail -1)
peak=$(echo "$last" | sed -nE 's/.*"peak_memory_mib": ?([0-9.]+).*/\1/p')
tps=$(echo "$last" | sed -nE 's/.*"tokens_per_second": ?([0-9.]+).*/\1/p')
ms=$(echo "$last" | sed -nE 's/.*"elapsed_ms_per_iteration": ?([0-9.]+).*/\1/p')
planned=$(awk 'NF == 15 && $1 ~ /^[0-9]+$/ { print $15 }' "$out/plan.txt")
echo
echo "$(date -u +%F) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "| model | flags | plan peak GiB | measured peak GiB | ms/it (last) | tokens/s |"
echo "|---|---|---|---|---|---|"
awk -v p="$planned" -v m="$peak" -v ms="$ms" -v t="$tps" -v f="$*" -v of="${OFFLOAD_FRACTION:-0.8}" 'BEGIN {
  printf "| llama-8b bf16 mbs 1 seq 2048 | offload %s, full recompute %s | %.2f | %.2f | %.0f | %.0f |\n", of, f, p / 1024, m / 1024, ms, t }'
