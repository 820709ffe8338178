// Megatron's TikTokenizer built on the npm `tiktoken` package (OpenAI's Rust tiktoken compiled to
// WebAssembly), as Megatron's tiktoken_tokenizer.py builds it: the vocabulary at
// $MEGATRON_TIKTOKEN_VOCAB (Megatron's JSON format) cut to vocab_size - 1000 entries and shifted by
// the 1000 special tokens (<unk> <s> </s> <mask> <pad> <cls> <sep>, then <SPECIAL_k>), the v2
// split pattern, and encode(text, allowed_special="all") (Megatron's text_to_ids).
// $MEGATRON_TIKTOKEN_VOCAB_SIZE is --vocab-size.
'use strict';
const fs = require('fs');
const PATTERN_V2 =
  '[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|' +
  '[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|' +
  '\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+';
require('./common').run((load) => {
  const { Tiktoken } = load('tiktoken');
  const numSpecial = 1000;
  const vocabSize = Number(process.env.MEGATRON_TIKTOKEN_VOCAB_SIZE);
  const vocab = JSON.parse(fs.readFileSync(process.env.MEGATRON_TIKTOKEN_VOCAB, 'utf8'));
  const ranks = vocab.slice(0, vocabSize - numSpecial).map((e) => `${e.token_bytes} ${e.rank + numSpecial}`);
  const specials = ['<unk>', '<s>', '</s>', '<mask>', '<pad>', '<cls>', '<sep>'];
  for (let k = specials.length; k < numSpecial; ++k) specials.push(`<SPECIAL_${k}>`);
  const encoding = new Tiktoken(ranks.join('\n') + '\n', Object.fromEntries(specials.map((t, i) => [t, i])), PATTERN_V2);
  return (text) => encoding.encode(text, 'all');
});
