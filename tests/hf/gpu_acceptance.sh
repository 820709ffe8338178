#!/usr/bin/env bash
# The Hugging Face bridge's acceptance on a GPU machine with torch and transformers:
#   tests/hf/gpu_acceptance.sh [BUILD_DIR]     (default build/gpu, as scripts/gpu-check.sh builds it)
# For LLaMA-3.2-1B-, Mistral-7B- (two layers), Qwen2.5-0.5B- and GPT-2-shaped random models:
# import, our logits on 8 prompts against transformers' (fp32 within 1e-3, bf16 within the bound
# test_hf_acceptance states), export and reload with AutoModelForCausalLM (same logits), 50 steps
# of fine-tuning, export, and transformers' loss on a batch against ours. Work files go to $OUT
# (or /tmp/hf-acceptance).
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build/gpu}"
work="${OUT:-/tmp}/hf-acceptance"
megatron="$build/megatron"
rm -rf "$work" && mkdir -p "$work"
python3 tests/hf/gpu_acceptance.py prepare "$work"
for family in llama mistral qwen2 gpt2; do
  d="$work/$family"
  "$megatron" import-hf --hf-dir "$d/hf" --save "$d/ckpt"
  "$megatron" export-hf --load "$d/ckpt" --hf-dir "$d/exported"
  "$megatron" train --load "$d/ckpt" --finetune --save "$d/finetuned" --mock-data --device cuda \
    --micro-batch-size 2 --global-batch-size 4 --seq-length 64 --train-iters 50 --lr 1e-5 --min-lr 1e-6 \
    --lr-warmup-iters 5 --log-interval 10 --save-interval 50 --eval-iters 0 | tee "$d/train.log"
  "$megatron" export-hf --load "$d/finetuned" --hf-dir "$d/finetuned-hf"
done
MEGATRON_HF_ACCEPTANCE_DIR="$work" "$build/test_hf_acceptance"
python3 tests/hf/gpu_acceptance.py check "$work"
