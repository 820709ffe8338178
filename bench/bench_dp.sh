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

source bench/train_runs.sh  # field, num, finish_run, ours, read_ours

# theirs NAME NPROC PRESET MBS: the PyTorch reference, under torchrun when NPROC > 1.
theirs() {
  local name=$1 np=$2 preset=$3 mbs=$4
  local launch=(python3)
  [ "$np" -gt 1 ] && launch=(python3 -m torch.distributed.run --standalone --nproc_per_node "$np")
  "${launch[@]}" bench/pytorch_reference.py --preset "$preset" --micro-batch-size "$mbs" > "$work/$name.log" 2>&1
  finish_run "$name" $?
}

# Sets ms tok tf peak opt as read_ours does, from the PyTorch reference's result line of run NAME.
read_theirs() {
  local last
  last=$(grep '^{"engine"' "$work/$1.log" 2>/dev/null | tail -1)
  ms=$(echo "$last" | field ms_per_iteration)
  tok=$(echo "$last" | field tokens_per_second)
  tf=$(echo "$last" | field tflops_per_gpu)
  peak=$(echo "$last" | field peak_memory_gib)
  opt=$(echo "$last" | field optimizer_state_mib | awk '{ if ($1 != "") print $1 / 1024 }')
}

# row PRESET LABEL NPROC BASE_MS BASE_TOK: prints one table line from ms tok tf peak opt; a run
# that left no figures (it failed: its row shows "-") makes the script exit 1.
row() {
  local eff exposed
  [ -n "$ms" ] || rc=1
  eff=$(awk -v a="$tok" -v b="$5" 'BEGIN { if (a > 0 && b > 0) printf "%.1f%%", 100 * a / b; else print "-" }')
  exposed=$(awk -v a="$ms" -v b="$4" 'BEGIN { if (a > 0 && b > 0) printf "%.1f", a - b; else print "-" }')
  [ "$3" -eq 1 ] && eff="(base)" exposed="(base)"
  echo "| $1 | $2 | $3 | $(num "$ms" %.1f) | $(num "$tok" %.0f) | $eff | $exposed | $(num "$tf" %.1f) | $(num "$peak" %.2f) | $(num "$opt" %.2f) |"
}

echo
echo "$(date -u +%F) ${gpus}x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); bf16, global batch = GPUs x micro-batch"
echo "| preset | engine / config | GPUs | ms/it | tokens/s per GPU | scaling efficiency | exposed comm ms/it | TFLOP/s/GPU | peak memory GiB | optimizer state GiB/GPU |"
echo "|---|---|---|---|---|---|---|---|---|---|"
rc=0
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
exit $rc
