#!/usr/bin/env bash
# Issue 16's "FP8 trains": scripts/demo.sh's model on its corpus for 1000 iterations in bf16 and in
# FP8 (hybrid: e4m3 forward, e5m2 gradients; delayed scaling, amax history 1024, max: Megatron's
# usual recipe), the same batches in the same order, and how far FP8's loss curve strays from
# bf16's. On the CPU the FP8 run is bench/fp8_emulated_curve.cpp's (exact casts, GEMM sums in f64);
# with DEVICE=cuda both are `megatron train` on the GPU.
# Usage: bench/bench_fp8_curve.sh BUILD_DIR DATA_DIR
#   DATA_DIR: demo.sh's work directory (fortunes_text_document.{bin,idx}, tokenizer.json).
#   FP8_FLAGS (default the delayed hybrid recipe above; e.g. "--fp8-format e4m3 --fp8-recipe
#   blockwise"), ITERS (default 1000), DEVICE (cpu|cuda, default cpu); the two runs go side by side, one
#   OpenMP thread each, on the CPU.
set -euo pipefail
build=${1:?build directory}
data=${2:?demo data directory}
iters=${ITERS:-1000}
device=${DEVICE:-cpu}
work=$(mktemp -d)
flags=(--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128
  --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
  --attention-dropout 0 --hidden-dropout 0 --micro-batch-size 16 --global-batch-size 16 --train-iters "$iters"
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 30 --weight-decay 0.1 --clip-grad 1.0
  --data-path "$data/fortunes_text_document" --split 95,5,0
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$data/tokenizer.json"
  --log-interval 1 --eval-interval 100 --eval-iters 4 --bf16 --device "$device")
# shellcheck disable=SC2206  # FP8_FLAGS is a flag list, split on spaces
fp8=(${FP8_FLAGS:---fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 1024 --fp8-amax-compute-algo max})
fp8_program=("$build/megatron" train)
[ "$device" = cpu ] && fp8_program=("$build/fp8_emulated_curve")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
"$build/megatron" train "${flags[@]}" --metrics-file "$work/bf16.jsonl" > "$work/bf16.log" 2>&1 &
bf16_pid=$!
"${fp8_program[@]}" "${flags[@]}" "${fp8[@]}" --metrics-file "$work/fp8.jsonl" > "$work/fp8.log" 2>&1 ||
  { tail -5 "$work/fp8.log"; exit 1; }
wait $bf16_pid || { tail -5 "$work/bf16.log"; exit 1; }

# "iteration loss" pairs of one kind (train or validation), the final evaluation left out.
losses() { sed -nE "/end_of_training/d; /\"kind\":\"$2\"/s/.*\"iteration\":([0-9]+),.*\"lm_loss\":([0-9.eE+-]+).*/\1 \2/p" "$work/$1.jsonl"; }
# "iteration bf16 fp8" for the iterations both runs logged, in order.
paired() { awk 'NR == FNR { bf16[$1] = $2; next } $1 in bf16 { print $1, bf16[$1], $2 }' <(losses bf16 "$1") <(losses fp8 "$1"); }
echo "$(date -u +%F) demo corpus, $iters iterations, device $device; bf16 vs FP8 ${fp8[*]}"
paired train | awk -v warmup=30 '
  $1 > warmup { d = $3 / $2 - 1; if (d < 0) d = -d; if (d > worst) { worst = d; at = $1 }
                w1 += $2; w2 += $3; if (++n % 50 == 0) { dw = w2 / w1 - 1; if (dw < 0) dw = -dw; if (dw > wworst) wworst = dw; w1 = w2 = 0 } }
  END { printf "train loss, per iteration after the warm-up: largest |fp8/bf16 - 1| %.4f (iteration %d)\n", worst, at
        printf "train loss, means over 50 iterations: largest |fp8/bf16 - 1| %.4f\n", wworst }'
echo "validation loss (iteration, bf16, fp8, fp8/bf16 - 1):"
paired validation | awk '{ printf "  %5d  %.4f  %.4f  %+.4f\n", $1, $2, $3, $3 / $2 - 1 }'
grep -h "elapsed time per iteration" "$work/bf16.log" | tail -1 | sed -E 's/.*elapsed time per iteration \(ms\): ([0-9.]+).*/bf16 ms per iteration (last): \1/'
grep -h "elapsed time per iteration" "$work/fp8.log" | tail -1 | sed -E 's/.*elapsed time per iteration \(ms\): ([0-9.]+).*/fp8 ms per iteration (last): \1/'
rm -rf "$work"
