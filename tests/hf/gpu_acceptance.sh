#!/usr/bin/env bash
# The Hugging Face bridge's acceptance on a GPU machine with torch and transformers:
#   tests/hf/gpu_acceptance.sh [BUILD_DIR [FAMILY...]]   (default build/gpu, every family)
# BUILD_DIR must hold `megatron` and `tests/test_hf_acceptance` already (about 2 minutes on 16 cores):
#   cmake --preset gpu && cmake --build build/gpu -j "$(nproc)" --target megatron test_hf_acceptance
# For LLaMA-3.2-1B-, Mistral-7B- (two layers), Qwen2.5-0.5B-, Qwen3-0.6B-, GPT-2-, Mixtral-8x7B- (one
# layer), Qwen1.5-MoE-A2.7B- and Qwen3-30B-A3B- (two layers) shaped random models, one family at a time: import; our logits on 8 prompts against transformers' (fp32 within 1e-3, bf16
# within the bound test_hf_acceptance states); for LLaMA, 256 new tokens generated with the KV cache
# and their tokens/s; export and reload with AutoModelForCausalLM (same logits); 50 steps of
# fine-tuning saved without optimizer state, export, and transformers' loss on a batch against ours.
# Each step's files are removed as soon as no later step reads them, and the family's directory
# before the next family starts (the 1B model is 5 GB in fp32 per copy; the machine has 64 GiB of
# disk). A failing family is reported and the next one still runs; the summary comes last and the
# exit status is 1 if any step failed. Work files and logs go to $OUT/hf-acceptance (or
# /tmp/hf-acceptance). Each family's minutes are printed; naming families (llama mistral qwen2
# qwen3 gpt2 mixtral qwen2_moe qwen3_moe) runs only those, so the work can be split over several runs of a time-limited machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build/gpu}"
shift || true
families=("$@")
[ ${#families[@]} -gt 0 ] || families=(llama mistral qwen2 qwen3 gpt2 mixtral qwen2_moe qwen3_moe)
work="${OUT:-/tmp}/hf-acceptance"
megatron="$build/megatron"
for binary in "$megatron" "$build/tests/test_hf_acceptance"; do
  [ -x "$binary" ] || { echo "gpu_acceptance.sh: $binary is missing; build it first (see the header of $0)" >&2; exit 2; }
done
python3 -c "import torch, transformers, safetensors, tokenizers" ||
  { echo "gpu_acceptance.sh: needs python3 with torch, transformers, safetensors and tokenizers" >&2; exit 2; }
rm -rf "$work" && mkdir -p "$work"

# One family, every step in order; the first failing step ends it (run in a subshell with set -e,
# whose status is read afterwards: under `||` bash would ignore set -e inside it).
family_acceptance() {
  local family="$1" d="$work/$1"
  local test_env=(env MEGATRON_HF_ACCEPTANCE_DIR="$work" MEGATRON_HF_ACCEPTANCE_FAMILY="$family")
  echo "=== $family: prepare, import" && df -h "$work" | tail -1
  python3 tests/hf/gpu_acceptance.py prepare "$work" "$family"
  "$megatron" import-hf --hf-dir "$d/hf" --save "$d/ckpt"
  rm -rf "$d/hf"
  echo "=== $family: logits of the imported checkpoint"
  "${test_env[@]}" "$build/tests/test_hf_acceptance" --gtest_filter=HfAcceptance.ImportedLogits
  if [ "$family" = llama ]; then
    # Greedy, past the end-of-document token too (a random model may well choose it): 256 tokens.
    echo "=== $family: 256 new tokens with the KV cache"
    "$megatron" generate --load "$d/ckpt" --device cuda --prompt "The quick brown fox" --max-new-tokens 256 \
      --temperature 0 --no-eod-termination 2>&1 >/dev/null | tee "$d/generate.log"
    grep "tokens/s" "$d/generate.log" | sed 's/^/llama-3.2-1b-shaped fp32, one GPU: /' > "$work/generation.txt"
  fi
  echo "=== $family: export"
  "$megatron" export-hf --load "$d/ckpt" --hf-dir "$d/exported"
  echo "=== $family: 50 fine-tuning steps, export"
  "$megatron" train --load "$d/ckpt" --finetune --save "$d/finetuned" --no-save-optim --mock-data --device cuda \
    --micro-batch-size 2 --global-batch-size 4 --seq-length 64 --train-iters 50 --lr 1e-5 --min-lr 1e-6 \
    --lr-warmup-iters 5 --log-interval 10 --save-interval 50 --eval-iters 0 | tee "$d/train.log"
  rm -rf "$d/ckpt"
  "$megatron" export-hf --load "$d/finetuned" --hf-dir "$d/finetuned-hf"
  "${test_env[@]}" "$build/tests/test_hf_acceptance" --gtest_filter=HfAcceptance.FinetunedLoss
  rm -rf "$d/finetuned"
  echo "=== $family: transformers loads the exports"
  python3 tests/hf/gpu_acceptance.py check "$work" "$family"
}

failed=()
for family in "${families[@]}"; do
  case "$family" in llama | mistral | qwen2 | qwen3 | gpt2 | mixtral | qwen2_moe | qwen3_moe) ;; *) echo "gpu_acceptance.sh: unknown family $family" >&2 && exit 2 ;; esac
  started=$SECONDS
  ( set -e; family_acceptance "$family" )
  [ $? -eq 0 ] || failed+=("$family")
  rm -rf "${work:?}/$family"
  echo "=== $family: $((SECONDS - started)) s"
done
echo "=== summary"
cat "$work/generation.txt" 2>/dev/null || echo "no generation tokens/s (llama not run, or a step before its generation failed)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]} (the first failing step of each is above)"
  exit 1
fi
echo "passed: ${families[*]}"
