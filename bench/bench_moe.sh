#!/usr/bin/env bash
# The one-GPU MoE benchmark: megatron-cpp trains the moe-1b-8x preset (llama-1b attention, every
# MLP replaced by 8 SwiGLU experts of width 2816, top-2 softmax routing, aux loss 1e-2, dropless)
# with --moe-grouped-gemm (at this preset's 2048-row experts one cuBLASLt GEMM per expert, the
# counts read once per layer: ops/grouped_gemm.h's kPerExpertGemmRows; MOE_LOOP=1 adds a run
# without the flag, Megatron's SequentialMLP), then the PyTorch
# reference (bench/pytorch_reference.py: the same model, torch.compile, experts through
# torch._grouped_mm, or a per-expert loop with a printed note where that is missing) on the same
# GPU: same shape, micro-batch and sequence, bf16 over fp32 master weights, AdamW (lr 1e-4, weight
# decay 0.01 on matrices), gradient clipping 1.0. Both train on uniform random token ids (ours from
# a dataset this script writes, the reference from torch.randint), since the routing, and so the
# experts' GEMM shapes, depend on the data: on Megatron's mock data (every document counting 1, 2,
# 3, ...) our routing collapses within ten steps (0/8192 tokens per expert), a row of its own
# here. The routing also depends on what each model has learnt, so a second pair runs with
# --moe-router-force-load-balancing (Megatron's benchmark aid: random router logits) on both
# sides: the same balanced load. Prints a markdown table with tokens/s, TFLOP/s (Megatron's
# formula, top-k experts per token), peak memory, the expert load (min/max tokens per expert over
# the layers: ours over the last log interval, the reference on its last batch) and the ratio.
# Ours: 30 iterations, timed over the log's last interval of 10; the reference: 5 warm-up + 20 timed.
# About 6-8 minutes on one H100/H200 (most of it torch.compile and our model's set-up).
#
# Usage: bench/bench_moe.sh [build_dir] [micro_batch]     (defaults: build/gpu, 4)
#   MOE_REF_LOOP=1 adds a row for the reference with one matmul per expert (--experts loop);
#   MOE_LOOP=1 a row for ours without --moe-grouped-gemm.
# Logs: $OUT (or /tmp/bench-moe): ours-moe.log, ours-moe-loop.log, the metrics files, ref-*.err.
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/gpu}"
mbs="${2:-4}"
preset=moe-1b-8x
out="${OUT:-/tmp/bench-moe}"
mkdir -p "$out"
work="$out"
logs="$out/bench-moe-logs.txt"
: > "$logs"
iters=30 log_interval=10

source bench/train_runs.sh  # field, num, finish_run, random_ids_dataset, ours, read_ours

random_ids_dataset "$out/random" || exit 1

load() {  # NAME: "min/max" tokens per expert of run NAME's last log interval
  grep '"kind":"train"' "$work/$1.jsonl" 2>/dev/null | tail -1 |
    sed -nE 's/.*"max_tokens_per_expert":([0-9]+).*"min_tokens_per_expert":([0-9]+).*/\2\/\1/p'
}

# ours with --moe-grouped-gemm on the random ids and on Megatron's mock data, and (MOE_LOOP=1)
# without it (Megatron's SequentialMLP: one cuBLASLt GEMM per expert, the counts read to the host
# once per layer's forward). --profile-ops-iteration 15 prints the device time per op family of a
# step between the warm-up and the timed interval (21-30).
data_path="$out/random_text_document"
ours ours-moe 1 "$preset" "$mbs" --moe-grouped-gemm --profile-ops-iteration 15
read_ours ours-moe 1
grouped=("$ms" "$tok" "$tf" "$peak" "$(load ours-moe)")
runs=(ours-moe)
if [ "${MOE_LOOP:-0}" = 1 ]; then
  ours ours-moe-loop 1 "$preset" "$mbs" --profile-ops-iteration 15
  read_ours ours-moe-loop 1
  loop=("$ms" "$tok" "$tf" "$peak" "$(load ours-moe-loop)")
  runs+=(ours-moe-loop)
fi
# The routing depends on what each engine has learnt; --moe-router-force-load-balancing
# (Megatron's benchmark aid, random router logits) gives both the same balanced load.
ours ours-moe-balanced 1 "$preset" "$mbs" --moe-grouped-gemm --moe-router-force-load-balancing
read_ours ours-moe-balanced 1
balanced=("$ms" "$tok" "$tf" "$peak" "$(load ours-moe-balanced)")
data_path=""
ours ours-moe-mock 1 "$preset" "$mbs" --moe-grouped-gemm
read_ours ours-moe-mock 1
mock=("$ms" "$tok" "$tf" "$peak" "$(load ours-moe-mock)")

reference() {  # NAME [flags...]: one reference run; sets r_ms r_tok r_tf r_mem r_load experts
  local name=$1
  shift
  local line
  line=$(timeout 420 python3 bench/pytorch_reference.py --preset "$preset" --micro-batch-size "$mbs" "$@" \
    2> "$out/$name.err" | tee "$out/$name.out" | tail -1)
  r_ms=$(echo "$line" | field ms_per_iteration)
  r_tok=$(echo "$line" | field tokens_per_second)
  r_tf=$(echo "$line" | field tflops_per_gpu)
  r_mem=$(echo "$line" | field peak_memory_gib)
  r_load=$(echo "$line" | sed -nE 's/.*"tokens_per_expert_min_max": ?\[([0-9]+), ?([0-9]+)\].*/\1\/\2/p')
  experts=$(echo "$line" | sed -nE 's/.*"experts": ?"([^"]+)".*/\1/p')
  [ -n "$r_ms" ] || { echo "$name failed:" >&2; tail -5 "$out/$name.err" >&2; }
  grep -h '^note:' "$out/$name.out" >&2
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }'; }
row() {  # LABEL ms tok tf peak load REF_TOK: one table row, its tokens/s against REF_TOK's
  echo "| $1 | $mbs | $(num "$2" %.1f) | $(num "$3" %.0f) | $(num "$4" %.1f) | $(num "$5" %.2f) | ${6:--} | $(ratio "$3" "$7") |"
}
ref_row() { row "PyTorch + torch.compile (experts: ${experts:-?}), $1" "$r_ms" "$r_tok" "$r_tf" "$r_mem" "$r_load" "$2"; }
reference ref-grouped
ref_tok=$r_tok
rows=("$(row "megatron-cpp, --moe-grouped-gemm, random ids" "${grouped[@]}" "$ref_tok")")
[ "${MOE_LOOP:-0}" = 1 ] &&
  rows+=("$(row "megatron-cpp, per-expert loop (no --moe-grouped-gemm), random ids" "${loop[@]}" "$ref_tok")")
rows+=("$(row "megatron-cpp, --moe-grouped-gemm, Megatron's mock data" "${mock[@]}" "$ref_tok")")
rows+=("$(ref_row "random ids" "$ref_tok")")
if [ "${MOE_REF_LOOP:-0}" = 1 ]; then
  reference ref-loop --experts loop
  rows+=("$(ref_row "random ids" "$ref_tok")")
fi
reference ref-balanced --moe-router-force-load-balancing
rows+=("$(row "megatron-cpp, --moe-grouped-gemm, random ids, forced balance" "${balanced[@]}" "$r_tok")")
rows+=("$(ref_row "random ids, forced balance" "$r_tok")")

echo
echo "$(date -u +%F) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); $preset, seq 2048, bf16"
echo "| engine | mbs | ms/it | tokens/s | TFLOP/s | peak memory GiB | tokens per expert min/max | tokens/s vs the grouped_mm reference of the same routing |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
for run in "${runs[@]}"; do
  echo "$run: device time per op family in iteration 15 (after ten steps, before the timed interval)"
  per_op_tables "$out/$run.log"
done
echo "ours: grouped GEMM fallback warnings (none expected):"
grep -i "grouped GEMM" "$out/ours-moe.log" | head -3
[ -n "${grouped[1]}" ]  # the exit status: ours ran (a failed reference shows "-")
