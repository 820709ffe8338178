// The npm `tiktoken` package's gpt2 encoder (Rust tiktoken compiled to WebAssembly) on a text
// file, timed like bench/tokenizer_bench.cpp: node tokenizer_bench_tiktoken.js FIXTURES FILE REPEATS
'use strict';
const fs = require('fs');
const path = require('path');
const [fixtures, file, repeats] = process.argv.slice(2);
const { get_encoding } = require(path.join(path.resolve(fixtures), 'node_modules', 'tiktoken'));
const encoding = get_encoding('gpt2');
const text = fs.readFileSync(file, 'utf8');
const bytes = Buffer.byteLength(text);
for (let pass = 1; pass <= Number(repeats); ++pass) {
  const start = process.hrtime.bigint();
  const tokens = encoding.encode_ordinary(text).length;
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(`pass ${pass}: ${bytes} bytes ${tokens} tokens ${seconds.toFixed(3)} s ${(bytes / 1e6 / seconds).toFixed(2)} MB/s`);
}
