# shellcheck shell=bash disable=SC2154  # build, work, logs, iters, log_interval: the sourcing script's
# Sourced by the benchmarks (bench_dp.sh, bench_tp.sh, bench_moe.sh, bench_training.sh): one
# `megatron train` run of a preset, on one GPU or under mpirun, the figures of its metrics file,
# and what `megatron plan` predicts for it. The sourcing script sets build (the build directory),
# work (a scratch directory), logs (the file every run's log is appended to), iters and
# log_interval.

field() { sed -nE "s/.*\"$1\": ?\"?([^,\"}]+).*/\1/p" | tail -1; }
num() { awk -v v="$1" -v f="$2" 'BEGIN { if (v != "" && v + 0 == v) printf f, v; else print "-" }'; }

# The op profiler's tables in a run's log (--profile-ops-iteration): time per op, then the idle
# time between ops, up to the next log line.
per_op_tables() { awk '/per-op time of iteration/ { on = 1; next } on && /^ \[|^=====/ { exit } on' "$1"; }

# Appends run NAME's log to $logs; on failure, shows its tail.
finish_run() {
  { echo "===== $1 (exit $2)"; cat "$work/$1.log"; } >> "$logs"
  [ "$2" -eq 0 ] || { echo "$1 failed ($2):" >&2; tail -5 "$work/$1.log" >&2; }
}

# run_flags NPROC PRESET MBS [flags...]: sets the array run_flags to the command line of one run
# (bf16, no dropout) with global batch NPROC x MBS x $accumulation (default 1), on Megatron's mock
# data or, where $data_path is set, on that dataset (all of it for training).
run_flags() {
  local np=$1 preset=$2 mbs=$3
  shift 3
  local vocab=32000
  case "$preset" in gpt2-*) vocab=50304 ;; llama-8b) vocab=128256 ;; esac
  local data=(--mock-data)
  [ -n "${data_path:-}" ] && data=(--data-path "$data_path" --split 100,0,0)
  run_flags=(--model-preset "$preset" --micro-batch-size "$mbs" --global-batch-size $((np * mbs * ${accumulation:-1}))
    --train-iters "$iters" --lr 1e-4 --bf16 --attention-dropout 0 --hidden-dropout 0 "${data[@]}"
    --tokenizer-type NullTokenizer --vocab-size "$vocab" --log-interval "$log_interval" --device cuda "$@")
}

# random_ids_dataset PREFIX: writes PREFIX_text_document.{bin,idx}, 64 documents of 8192 uniform
# random ids below the NullTokenizer's EOD (32000 - 1), for runs that must see the token
# distribution of the PyTorch reference's torch.randint batches (which also draw id 31999, one in
# 32000): 255 samples of 2049 tokens.
random_ids_dataset() {
  awk -v docs=64 -v len=8192 -v ids=31999 'BEGIN { srand(1234); for (d = 0; d < docs; d++) {
    printf "{\"text\": \""; for (i = 0; i < len; i++) printf "%s%d", (i ? " " : ""), int(rand() * ids); print "\"}" } }' \
    > "$1.jsonl"
  "$build/megatron" preprocess-data --input "$1.jsonl" --output-prefix "$1" --tokenizer-type NullTokenizer \
    --vocab-size 32000 > "$1.preprocess.log" 2>&1 || { cat "$1.preprocess.log" >&2; return 1; }
}

# ours NAME NPROC PRESET MBS [flags...]: one `megatron train` run of run_flags' command line; its
# metrics go to $work/NAME.jsonl.
ours() {
  local name=$1 np=$2
  shift 2
  run_flags "$np" "$@"
  local launch=()
  [ "$np" -gt 1 ] && launch=(mpirun --allow-run-as-root --bind-to none -np "$np" -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH
    ${CUDA_DEVICE_MAX_CONNECTIONS:+-x CUDA_DEVICE_MAX_CONNECTIONS})  # passed on when set (an experiment's knob)
  "${launch[@]}" "$build/megatron" train "${run_flags[@]}" --metrics-file "$work/$name.jsonl" > "$work/$name.log" 2>&1
  finish_run "$name" $?
}

# read_plan NPROC PRESET MBS [flags...]: sets plan, the peak memory per GPU in GiB that `megatron
# plan` predicts for ours' run of the same arguments (its largest stage), "" where plan failed.
read_plan() {
  run_flags "$@"
  # shellcheck disable=SC2034  # read by the sourcing script
  plan=$("$build/megatron" plan --plan-world-size "$1" "${run_flags[@]}" 2>/dev/null |
    awk 'NF == 15 && $1 ~ /^[0-9]+$/ { print $15 }' | sort -g | tail -1 | awk '{ if ($1 != "") print $1 / 1024 }')
}

# Sets, from the last interval of run NAME on NPROC GPUs, "" where it failed: ms (per iteration),
# tok (tokens/s per GPU), tf (TFLOP/s/GPU), and in GiB per GPU: peak (memory in tensors), reserved
# (what the allocator holds from the device), opt (optimizer state), act (activations one
# micro-batch keeps for backward).
read_ours() {
  local last
  last=$(grep '"kind":"train"' "$work/$1.jsonl" 2>/dev/null | tail -1)
  ms=$(echo "$last" | field elapsed_ms_per_iteration)
  tok=$(echo "$last" | field tokens_per_second | awk -v n="$2" '{ if ($1 != "") print $1 / n }')
  tf=$(echo "$last" | field tflops_per_gpu)
  peak=$(echo "$last" | field peak_memory_mib | awk '{ if ($1 != "") print $1 / 1024 }')
  reserved=$(echo "$last" | field reserved_memory_mib | awk '{ if ($1 != "") print $1 / 1024 }')
  opt=$(echo "$last" | field optimizer_state_mib | awk '{ if ($1 != "") print $1 / 1024 }')
  act=$(echo "$last" | field activation_memory_mib | awk '{ if ($1 != "") print $1 / 1024 }')
}
