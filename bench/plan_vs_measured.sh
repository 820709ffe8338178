#!/usr/bin/env bash
# `megatron plan` against the peak memory training measures on one GPU: for each run, the plan of
# the command line, then the same command line trained for a few iterations (bf16, mock data, as
# bench/bench_training.sh); prints a markdown table (plan GiB, measured GiB = the caching
# allocator's peak of bytes handed out, from the metrics file, and the difference) and the plan's
# expected step time beside the measured one. Logs go to $OUT (or /tmp/plan_vs_measured).
# usage: bench/plan_vs_measured.sh [build_dir] ["preset:micro_batch[:extra flags]" ...]
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/gpu}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(
  "gpt2-124m:32" "llama-1b:8" "llama-3b:2" "llama-1b:8:--recompute-granularity selective --recompute-modules core_attn mlp"
  "llama-1b:16:--recompute-granularity full --recompute-method uniform --recompute-num-layers 1" "moe-1b-8x:2")
out="${OUT:-/tmp/plan_vs_measured}"
mkdir -p "$out"
field() { sed -nE "s/.*\"$1\": ?\"?([^,\"}]+).*/\1/p" | tail -1; }
rows=()
i=0
for run in "${runs[@]}"; do
  IFS=: read -r preset mbs extra <<<"$run"
  case "$preset" in gpt2-*) vocab=50304 ;; llama-8b) vocab=128256 ;; *) vocab=32000 ;; esac
  i=$((i + 1))
  flags="--model-preset $preset --micro-batch-size $mbs --lr 1e-4 --bf16 --attention-dropout 0 --hidden-dropout 0
    --mock-data --tokenizer-type NullTokenizer --vocab-size $vocab --device cuda $extra"
  # shellcheck disable=SC2086
  "$build/megatron" plan $flags --train-iters 10 >"$out/plan-$i.txt" 2>&1
  planned=$(awk 'NF == 15 && $1 ~ /^[0-9]+$/ { print $15 }' "$out/plan-$i.txt" | sort -g | tail -1)
  plan_ms=$(sed -nE 's/^expected step time on .*: ([0-9.]+) ms.*/\1/p' "$out/plan-$i.txt")
  rm -f "$out/metrics-$i.jsonl"
  # shellcheck disable=SC2086
  "$build/megatron" train $flags --train-iters 10 --log-interval 5 --metrics-file "$out/metrics-$i.jsonl" \
    >"$out/train-$i.log" 2>&1 || tail -5 "$out/train-$i.log"
  last=$(grep '"kind":"train"' "$out/metrics-$i.jsonl" 2>/dev/null | tail -1)
  measured=$(echo "$last" | field peak_memory_mib)
  ms=$(echo "$last" | field elapsed_ms_per_iteration)
  rows+=("$(awk -v r="$preset mbs $mbs $extra" -v p="$planned" -v m="$measured" -v pt="$plan_ms" -v mt="$ms" 'BEGIN {
    if (m > 0) printf "| %s | %.2f | %.2f | %+.1f%% | %.1f | %.1f |", r, p / 1024, m / 1024, 100 * (p - m) / m, pt, mt;
    else printf "| %s | %.2f | FAIL | - | %.1f | - |", r, p / 1024, pt }')")
done
echo
echo "$(date -u +%F) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "| run | plan peak GiB | measured peak GiB | plan - measured | plan ms/it | measured ms/it (iterations 6-10) |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
