#!/usr/bin/env bash
# Tokenizer throughput per core (a benchmark, not a test): our GPT2BPETokenizer beside the npm
# tiktoken package's gpt2 encoder under node, both pinned to one core, on the same text: about
# 3 MB of fortunes and this repository's sources. Also our LLaMA-3 HuggingFaceTokenizer.
# Prints each pass; the first starts with empty caches.
# Usage: bench/tokenizer_bench.sh [BUILD_DIR]   (default build/release, configured if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/release}"
scripts/fetch-fixtures.sh
if [ -f "$build/build.ninja" ]; then
  cmake --build "$build" --target megatron_lib >/dev/null
else
  scripts/build.sh release --target megatron_lib >/dev/null
  build=build/release
fi
out=build/bench
mkdir -p "$out"
corpus="$out/tokenizer_corpus.txt"
# Whole lines only (no character cut in two); the early exit of awk must not fail the script.
(
  set +o pipefail
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' 2>/dev/null | LC_ALL=C sort |
    xargs -r cat | LC_ALL=C awk '{ n += length($0) + 1; if (n > 2000000) exit; print }'
  find src tools -name '*.h' -o -name '*.cpp' | LC_ALL=C sort | xargs cat |
    LC_ALL=C awk '{ n += length($0) + 1; if (n > 1000000) exit; print }'
) >"$corpus" 2>/dev/null
g++ -O2 -std=c++20 -Isrc bench/tokenizer_bench.cpp "$build/libmegatron.a" -lpcre2-8 -lsentencepiece -pthread \
  -o "$out/tokenizer_bench"
pin="taskset -c 0"
command -v taskset >/dev/null || pin=""
echo "== $(date -u +%F) $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "== GPT-2, ours (GPT2BPETokenizer, one thread)"
$pin "$out/tokenizer_bench" "$corpus" 3 --tokenizer-type GPT2BPETokenizer --vocab-file build/fixtures/gpt2/vocab.json \
  --merge-file build/fixtures/gpt2/merges.txt
echo "== GPT-2, npm tiktoken $(node -p "require('./build/fixtures/node_modules/tiktoken/package.json').version") (node $(node --version))"
$pin node bench/tokenizer_bench_tiktoken.js build/fixtures "$corpus" 3
echo "== LLaMA-3, ours (HuggingFaceTokenizer, one thread)"
$pin "$out/tokenizer_bench" "$corpus" 3 --tokenizer-type HuggingFaceTokenizer --tokenizer-model build/fixtures/llama3
