#!/usr/bin/env bash
# Context parallelism at long sequences: megatron-cpp trains a preset at sequence $SEQ (default
# 32768) on the node's N GPUs ($GPUS, default every visible GPU) as
#   CP = 1 x DP = N            (the baseline: every GPU holds whole sequences),
#   CP = 2 x DP = N/2, CP = 4 x DP = N/4 (where they divide N), for each --cp-comm-type in $COMM
#   (default p2p, the ring; e.g. COMM="p2p allgather a2a a2a+p2p"; a2a+p2p runs with
#   --hierarchical-context-parallel-sizes 2 CP/2: the all-to-all inside GPU pairs, the ring across),
# each with selective recompute (--recompute-granularity selective --recompute-modules core_attn
# mlp: the recipe that fits 32k on one GPU), --use-distributed-optimizer where DP x CP > 1, bf16, no
# dropout, mock data, $ITERS iterations (default 20) timed over the log's last interval (11-20).
#
# Same work per GPU: every layout keeps --micro-batch-size MBS and --global-batch-size
# N x MBS x ACC ($ACC, default 2), so a DP replica runs ACC x CP micro-batches per step, each CP
# rank holding S/CP tokens of each: every GPU computes the same tokens and, the causal split being
# load-balanced, the same attention FLOPs (ACC x S^2/2 per GPU), and the gradients reduce over
# DP x CP = N GPUs in every layout. So
#   exposed CP communication = ms/it at CP - ms/it at CP 1: the ring's transfers that its block
#   computation did not hide, with the ring's extra work (two L x L calls per step and the merges);
# beside it the attention time of one CP rank's iteration (device time of the attention ops,
# merges included, from --profile-ops-iteration 5, a warm-up iteration outside the timed interval),
# activations one micro-batch keeps per GPU, and peak memory per GPU.
#
# Prints one markdown table, a row as soon as its run is done; every run's log is appended to
# $OUT/bench-cp-logs.txt.
# Usage: bench/bench_cp.sh [build_dir] [preset:micro_batch ...]   (default: llama-1b:1)
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/gpu}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(llama-1b:1)
gpus="${GPUS:-$(nvidia-smi -L | wc -l)}"
[ "$gpus" -ge 2 ] || { echo "bench_cp.sh: $gpus GPU(s) visible; context parallelism needs 2 or more" >&2; exit 2; }
out="${OUT:-/tmp/bench-cp}"
mkdir -p "$out"
work="$(mktemp -d /tmp/bench-cp.XXXXXX)"
logs="$out/bench-cp-logs.txt"
: > "$logs"
export NCCL_NVLS_ENABLE=0  # never NVLink multicast (shared machines); mpirun passes it on with -x
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
iters="${ITERS:-20}" log_interval=10
accumulation="${ACC:-2}"
seq="${SEQ:-32768}"
read -r -a comms <<< "${COMM:-p2p}"

source bench/train_runs.sh  # field, num, finish_run, ours, read_ours

# Milliseconds of the attention ops (forward, backward, fused-QKV forms, merges) in the op table
# that --profile-ops-iteration printed into run NAME's log; "" when it printed none.
attention_ms() {
  awk -F'|' '$2 ~ /^ *attention_(forward|backward|merge)/ { ms += $4; found = 1 } END { if (found) printf "%.1f", ms }' \
    "$work/$1.log" 2>/dev/null
}

echo
echo "$(date -u +%F) ${gpus}x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); bf16, sequence $seq, global batch = GPUs x micro-batch x $accumulation in every layout"
echo "| preset | layout | GPUs | micro-batches per replica | ms/it | tokens/s per GPU | ratio to CP 1 | exposed CP comm ms/it (ms/it - CP 1's) | attention ms/it (one rank, device) | activations GiB/GPU (one micro-batch) | peak memory GiB/GPU | TFLOP/s/GPU | lm loss (last) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
rc=0
for run in "${runs[@]}"; do
  preset="${run%%:*}" mbs="${run##*:}"
  base_ms="" base_tok=""
  specs=(1:none)
  for cp in 2 4; do for comm in "${comms[@]}"; do specs+=("$cp:$comm"); done; done
  for spec in "${specs[@]}"; do
    cp=${spec%%:*} comm=${spec##*:}
    [ $((gpus % cp)) -eq 0 ] || continue
    dp=$((gpus / cp)) micro=$((accumulation * cp))
    flags=(--seq-length "$seq" --max-position-embeddings "$seq" --recompute-granularity selective
      --recompute-modules core_attn mlp --use-distributed-optimizer --profile-ops-iteration 5)
    layout="DP $gpus"
    if [ "$cp" -gt 1 ]; then
      flags+=(--context-parallel-size "$cp" --cp-comm-type "$comm")
      [ "$comm" = "a2a+p2p" ] && flags+=(--hierarchical-context-parallel-sizes 2 $((cp / 2)))
      layout="CP $cp x DP $dp ($comm)"
    fi
    name="ours-$preset-cp$cp-$comm-dp$dp"
    ours "$name" "$gpus" "$preset" "$mbs" "${flags[@]}"
    read_ours "$name" "$gpus"
    [ -n "$ms" ] || rc=1  # the run failed: its row shows "-"
    loss=$(grep '"kind":"train"' "$work/$name.jsonl" 2>/dev/null | tail -1 | field lm_loss)
    if [ "$cp" -eq 1 ]; then base_ms=$ms base_tok=$tok; fi
    ratio=$(awk -v a="$tok" -v b="$base_tok" 'BEGIN { if (a > 0 && b > 0) printf "%.1f%%", 100 * a / b; else print "-" }')
    exposed=$(awk -v a="$ms" -v b="$base_ms" 'BEGIN { if (a > 0 && b > 0) printf "%.1f", a - b; else print "-" }')
    if [ "$cp" -eq 1 ]; then ratio="(base)" exposed="(base)"; fi
    echo "| $preset (mbs $mbs) | $layout | $gpus | $micro | $(num "$ms" %.1f) | $(num "$tok" %.0f) | $ratio | $exposed | $(num "$(attention_ms "$name")" %.1f) | $(num "$act" %.2f) | $(num "$peak" %.2f) | $(num "$tf" %.1f) | $(num "$loss" %.4f) |"
  done
done
exit $rc
