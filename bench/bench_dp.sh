#!/usr/bin/env bash
# Data-parallel scaling on one node: megatron-cpp on 1 GPU and on $GPUS GPUs (DP = $GPUS, mpirun,
# overlapped gradient reduction; then also the distributed optimizer with overlapped parameter
# gather) beside PyTorch on 1 GPU and PyTorch DDP on $GPUS GPUs (bench/pytorch_reference.py under
# torchrun). Same model and per-GPU micro-batch everywhere; the global batch is GPUs x micro-batch
# (one micro-batch per GPU per step), so the per-GPU work is the same at every size and
#   scaling efficiency = tokens/s per GPU at DP / tokens/s on 1 GPU (same engine),
#   exposed communication = ms/it at DP - ms/it on 1 GPU (same engine): what overlap did not hide.
# Prints one markdown table, a row as soon as its runs are done (a run cut short by a time limit
# still leaves the rows before it); every run's log is appended to $OUT/bench-dp-logs.txt.
# Usage: bench/bench_dp.sh [build_dir] [preset:micro_batch ...]   (default: llama-1b:8 llama-3b:4)
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/gpu}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(llama-1b:8 llama-3b:4)
gpus="${GPUS:-4}"
out="${OUT:-/tmp/bench-dp}"
mkdir -p "$out"
work="$(mktemp -d /tmp/bench-dp.XXXXXX)"
logs="$out/bench-dp-logs.txt"
: > "$logs"
export NCCL_NVLS_ENABLE=0  # never NVLink multicast (shared machines); mpirun passes it on with -x
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
iters=30 log_interval=10  # as bench_training.sh: iterations 1-10 warm up, the last interval (11-30) is measured

field() { sed -nE "s/.*\"$1\": ?\"?([^,\"}]+).*/\1/p" | tail -1; }
num() { awk -v v="$1" -v f="$2" 'BEGIN { if (v != "" && v + 0 == v) printf f, v; else print "-" }'; }

# Appends run NAME's log to $logs; on failure, shows its tail.
finish_run() {
  { echo "===== $1 (exit $2)"; cat "$work/$1.log"; } >> "$logs"
  [ "$2" -eq 0 ] || { echo "$1 failed ($2):" >&2; tail -5 "$work/$1.log" >&2; }
}

# ours NAME NPROC PRESET MBS [flags...]: one `megatron train` run; its metrics go to $work/NAME.jsonl.
ours() {
  local name=$1 np=$2 preset=$3 mbs=$4
  shift 4
  local vocab=32000
  case "$preset" in gpt2-*) vocab=50304 ;; llama-8b) vocab=128256 ;; esac
  local launch=()
  [ "$np" -gt 1 ] && launch=(mpirun --allow-run-as-root --bind-to none -np "$np" -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH)
  "${launch[@]}" "$build/megatron" train --model-preset "$preset" --micro-batch-size "$mbs" \
    --global-batch-size $((np * mbs)) --train-iters $iters --lr 1e-4 --bf16 --attention-dropout 0 \
    --hidden-dropout 0 --mock-data --tokenizer-type NullTokenizer --vocab-size $vocab \
    --log-interval $log_interval --metrics-file "$work/$name.jsonl" --device cuda "$@" > "$work/$name.log" 2>&1
  finish_run "$name" $?
}

# theirs NAME NPROC PRESET MBS: the PyTorch reference, under torchrun when NPROC > 1.
theirs() {
  local name=$1 np=$2 preset=$3 mbs=$4
  local launch=(python3)
  [ "$np" -gt 1 ] && launch=(python3 -m torch.distributed.run --standalone --nproc_per_node "$np")
  "${launch[@]}" bench/pytorch_reference.py --preset "$preset" --micro-batch-size "$mbs" > "$work/$name.log" 2>&1
  finish_run "$name" $?
}

# Sets ms tok tf peak opt (per GPU; memory in GiB) from run NAME of NPROC GPUs, "" where it failed.
read_ours() {
  local last
  last=$(grep '"kind":"train"' "$work/$1.jsonl" 2>/dev/null | tail -1)
  ms=$(echo "$last" | field elapsed_ms_per_iteration)
  tok=$(echo "$last" | field tokens_per_second | awk -v n="$2" '{ if ($1 != "") print $1 / n }')
  tf=$(echo "$last" | field tflops_per_gpu)
  peak=$(echo "$last" | field peak_memory_mib | awk '{ if ($1 != "") print $1 / 1024 }')
  opt=$(echo "$last" | field optimizer_state_mib | awk '{ if ($1 != "") print $1 / 1024 }')
}
read_theirs() {
  local last
  last=$(grep '^{"engine"' "$work/$1.log" 2>/dev/null | tail -1)
  ms=$(echo "$last" | field ms_per_iteration)
  tok=$(echo "$last" | field tokens_per_second)
  tf=$(echo "$last" | field tflops_per_gpu)
  peak=$(echo "$last" | field peak_memory_gib)
  opt=$(echo "$last" | field optimizer_state_mib | awk '{ if ($1 != "") print $1 / 1024 }')
}

# row PRESET LABEL NPROC BASE_MS BASE_TOK: prints one table line from ms tok tf peak opt.
row() {
  local eff exposed
  eff=$(awk -v a="$tok" -v b="$5" 'BEGIN { if (a > 0 && b > 0) printf "%.1f%%", 100 * a / b; else print "-" }')
  exposed=$(awk -v a="$ms" -v b="$4" 'BEGIN { if (a > 0 && b > 0) printf "%.1f", a - b; else print "-" }')
  [ "$3" -eq 1 ] && eff="(base)" exposed="(base)"
  echo "| $1 | $2 | $3 | $(num "$ms" %.1f) | $(num "$tok" %.0f) | $eff | $exposed | $(num "$tf" %.1f) | $(num "$peak" %.2f) | $(num "$opt" %.2f) |"
}

echo
echo "$(date -u +%F) ${gpus}x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); bf16, global batch = GPUs x micro-batch"
echo "| preset | engine / config | GPUs | ms/it | tokens/s per GPU | scaling efficiency | exposed comm ms/it | TFLOP/s/GPU | peak memory GiB | optimizer state GiB/GPU |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for run in "${runs[@]}"; do
  preset="${run%%:*}" mbs="${run##*:}"
  ours "ours-$preset-1gpu" 1 "$preset" "$mbs"
  read_ours "ours-$preset-1gpu" 1
  base_ms=$ms base_tok=$tok
  row "$preset (mbs $mbs)" "ours, 1 GPU" 1 "$base_ms" "$base_tok"
  ours "ours-$preset-dp$gpus" "$gpus" "$preset" "$mbs" --overlap-grad-reduce
  read_ours "ours-$preset-dp$gpus" "$gpus"
  row "$preset (mbs $mbs)" "ours, DP $gpus, --overlap-grad-reduce" "$gpus" "$base_ms" "$base_tok"
  ours "ours-$preset-dp$gpus-distopt" "$gpus" "$preset" "$mbs" --overlap-grad-reduce --use-distributed-optimizer \
    --overlap-param-gather
  read_ours "ours-$preset-dp$gpus-distopt" "$gpus"
  row "$preset (mbs $mbs)" "ours, DP $gpus, + --use-distributed-optimizer --overlap-param-gather" "$gpus" "$base_ms" \
    "$base_tok"

  theirs "torch-$preset-1gpu" 1 "$preset" "$mbs"
  read_theirs "torch-$preset-1gpu"
  base_ms=$ms base_tok=$tok
  row "$preset (mbs $mbs)" "PyTorch+compile, 1 GPU" 1 "$base_ms" "$base_tok"
  theirs "torch-$preset-ddp$gpus" "$gpus" "$preset" "$mbs"
  read_theirs "torch-$preset-ddp$gpus"
  row "$preset (mbs $mbs)" "PyTorch+compile DDP, $gpus GPUs" "$gpus" "$base_ms" "$base_tok"
done
