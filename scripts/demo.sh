#!/usr/bin/env bash
# The main job, end to end on one CPU: install what is missing, build, turn the fortune-cookie
# corpus (Debian's `fortunes` packages) into Megatron .bin/.idx data, train a small GPT on it,
# show the validation loss falling, and print text sampled from the trained model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The demo trains on the CPU: without a GPU it builds the CPU backend only (the CUDA kernels
# take minutes to compile on a small machine and would not be used). The first build takes
# minutes; its progress shows as one line (scripts/build-progress.sh), with any compiler message.
echo "building megatron (minutes the first time; cached after)"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  scripts/build.sh release --target megatron 2>&1 | scripts/build-progress.sh "building megatron"
  bin=build/release/megatron
else
  [ -f build/demo-cpu/build.ninja ] || cmake --preset release -B build/demo-cpu -DMEGATRON_CUDA=OFF >/dev/null
  cmake --build build/demo-cpu -j "$(nproc)" --target megatron 2>&1 | scripts/build-progress.sh "building megatron"
  bin=build/demo-cpu/megatron
fi
work="${MEGATRON_DEMO_DIR:-/tmp/megatron-demo}"
iters="${MEGATRON_DEMO_ITERS:-800}"
rm -rf "$work" && mkdir -p "$work"

# One JSON document per fortune (entries are separated by lines holding a single '%').
# Backslashes become '/', tabs spaces and other control characters are dropped, so the only
# escapes needed are \" and \n.
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8|*/art|*/ascii-art) continue ;; esac
  [ -f "$f" ] && cat "$f" && echo "%"
done | LC_ALL=C awk '
  function flush() {
    if (doc != "") {
      gsub(/\\/, "/", doc); gsub(/\t/, " ", doc); gsub(/"/, "\\\"", doc); gsub(/\n/, "\\n", doc)
      gsub(/[\001-\037\177]/, "", doc)
      printf "{\"text\": \"%s\"}\n", doc
    }
    doc = ""
  }
  $0 == "%" { flush(); next }
  { doc = (doc == "" ? $0 : doc "\n" $0) }
  END { flush() }' > "$work/fortunes.jsonl"
echo "corpus: $(wc -l < "$work/fortunes.jsonl") fortunes, $(du -h "$work/fortunes.jsonl" | cut -f1)"

# A byte-level BPE vocabulary learned from the corpus itself, saved as a Hugging Face tokenizer.json.
"$bin" train-tokenizer --input "$work/fortunes.jsonl" --vocab-size 1024 --output "$work/tokenizer.json"
tokenizer=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$work/tokenizer.json")
"$bin" preprocess-data --input "$work/fortunes.jsonl" --output-prefix "$work/fortunes" "${tokenizer[@]}" \
  --append-eod --workers 2

"$bin" train \
  --num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128 \
  --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear \
  --attention-dropout 0 --hidden-dropout 0 \
  --micro-batch-size 16 --global-batch-size 16 --train-iters "$iters" \
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 30 --weight-decay 0.1 --clip-grad 1.0 \
  --data-path "$work/fortunes_text_document" --split 95,5,0 "${tokenizer[@]}" \
  --log-interval 50 --eval-interval 100 --eval-iters 4 \
  --save "$work/checkpoints" --save-interval "$iters" --metrics-file "$work/metrics.jsonl" \
  --device cpu

# Iteration 1's loss is measured before the first update: the fresh model's loss. The evaluation
# after training (end_of_training) is a second point at the last iteration; it is left out.
loss_of() { sed -nE "/end_of_training/d; /\"kind\":\"$1\"/s/.*\"iteration\":([0-9]+),.*\"lm_loss\":([0-9.eE+-]+).*/\1 \2/p" "$work/metrics.jsonl"; }
initial=$(loss_of train | awk '$1 == 1 { print $2 }')
echo
echo "loss of the fresh model (iteration 1, before any update): $initial"
echo "validation loss by iteration:"
loss_of validation | awk -v init="$initial" '{ printf "  %5d  %.3f  (%.0f%% of initial)\n", $1, $2, 100 * $2 / init }'
echo
"$bin" generate --load "$work/checkpoints" --prompt "The" --max-new-tokens 100 --num-samples 3 \
  --temperature 0.8 --top-k 20 --seed 7
