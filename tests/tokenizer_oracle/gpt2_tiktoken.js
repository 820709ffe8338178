// GPT-2 ids from the npm `tiktoken` package (OpenAI's Rust tiktoken compiled to WebAssembly),
// which carries its own copy of GPT-2's ranks: an oracle independent of vocab.json/merges.txt.
'use strict';
require('./common').run((load) => {
  const encoding = load('tiktoken').get_encoding('gpt2');
  return (text) => encoding.encode_ordinary(text);  // <|endoftext|> stays text, as in Megatron
});
