#!/usr/bin/env bash
# Training throughput of megatron-cpp beside the PyTorch reference (bench/pytorch_reference.py),
# same model, batch and GPU, in one command. Prints a markdown table; full logs go to $OUT
# (or /tmp/bench), each finished row to $out/rows.md as it comes and each reference's output to
# ref-PRESET.out, so a run cut short keeps what it measured.
# Usage: bench/bench_training.sh [build_dir] [preset:micro_batch ...]
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/gpu}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(gpt2-124m:32 llama-1b:8)
out="${OUT:-/tmp/bench}"
mkdir -p "$out"
iters=30        # ours: iterations 1-10 warm up, the log's last interval (11-30) is the measurement
log_interval=10

source bench/train_runs.sh  # field, per_op_tables

rows=()
rm -f "$out/rows.md"
for run in "${runs[@]}"; do
  preset="${run%%:*}"; mbs="${run##*:}"
  case "$preset" in gpt2-*) vocab=50304 ;; llama-8b) vocab=128256 ;; *) vocab=32000 ;; esac
  metrics="$out/ours-$preset.jsonl"
  rm -f "$metrics"
  "$build/megatron" train --model-preset "$preset" --micro-batch-size "$mbs" --train-iters $iters --lr 1e-4 \
    --bf16 --attention-dropout 0 --hidden-dropout 0 --mock-data --tokenizer-type NullTokenizer --vocab-size $vocab \
    --log-interval $log_interval --metrics-file "$metrics" --profile-ops-iteration 5 --device cuda \
    > "$out/ours-$preset.log" 2>&1
  ours_rc=$?
  last=$(grep '"kind":"train"' "$metrics" 2>/dev/null | tail -1)
  o_ms=$(echo "$last" | field elapsed_ms_per_iteration); o_tok=$(echo "$last" | field tokens_per_second)
  o_tf=$(echo "$last" | field tflops_per_gpu); o_mem=$(echo "$last" | field peak_memory_mib)
  o_res=$(echo "$last" | field reserved_memory_mib)
  [ $ours_rc -eq 0 ] || { o_ms="FAIL($ours_rc)"; tail -5 "$out/ours-$preset.log"; }

  python3 bench/pytorch_reference.py --preset "$preset" --micro-batch-size "$mbs" > "$out/ref-$preset.out" \
    2> "$out/ref-$preset.err"
  ref=$(tail -1 "$out/ref-$preset.out")
  r_ms=$(echo "$ref" | field ms_per_iteration); r_tok=$(echo "$ref" | field tokens_per_second)
  r_tf=$(echo "$ref" | field tflops_per_gpu); r_mem=$(echo "$ref" | field peak_memory_gib)
  r_res=$(echo "$ref" | field peak_reserved_gib)
  [ -n "$r_ms" ] || { r_ms="FAIL"; tail -5 "$out/ref-$preset.err"; }
  ratio=$(awk -v a="$o_tok" -v b="$r_tok" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')
  mfu=$(awk -v t="$o_tf" 'BEGIN { if (t > 0) printf "%.1f%%", 100 * t / 989; else print "-" }')
  rmfu=$(awk -v t="$r_tf" 'BEGIN { if (t > 0) printf "%.1f%%", 100 * t / 989; else print "-" }')
  gib() { awk -v m="$1" 'BEGIN { if (m > 0) printf "%.2f", m / 1024; else print "-" }'; }
  fmt() { awk -v v="$1" -v f="$2" 'BEGIN { if (v + 0 == v && v != "") printf f, v; else print v }'; }
  rows+=("| $preset | $mbs | $(fmt "$o_ms" %.1f) | $(fmt "$o_tok" %.0f) | $(fmt "$o_tf" %.1f) | $mfu | $(gib "$o_mem") | $(gib "$o_res") | $(fmt "$r_ms" %.1f) | $(fmt "$r_tok" %.0f) | $(fmt "$r_tf" %.1f) | $rmfu | ${r_mem:--} | ${r_res:--} | $ratio |")
  echo "${rows[-1]}" >> "$out/rows.md"  # a run cut short keeps the rows it finished
done

echo
echo "$(date -u +%F) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
# Peak: the most bytes handed out (ours: the caching allocator's; torch: max_memory_allocated).
# Reserved: what the allocator holds from the device, what the run needs of the GPU (ours at the
# last log line, which only an allocation failure emptying the cache lowers; torch:
# max_memory_reserved).
echo "| preset | mbs | ours ms/it | ours tok/s | ours TFLOP/s | ours MFU | ours peak GiB | ours reserved GiB | torch ms/it | torch tok/s | torch TFLOP/s | torch MFU | torch peak GiB | torch reserved GiB | ours/torch |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
for run in "${runs[@]}"; do
  preset="${run%%:*}"
  echo
  echo "ours, $preset: device time per op family in iteration 5 (a warm-up step, outside the timed interval)"
  per_op_tables "$out/ours-$preset.log"
done
