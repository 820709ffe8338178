// Writes a vocabulary in Megatron's TikTokenizer format (a JSON list of {rank, token_bytes,
// token_str}, the 256 single bytes first in byte order) made of cl100k_base's tokens from the npm
// `tiktoken` package: the bytes, then every longer token in cl100k's rank order. Relative ranks of
// the longer tokens are cl100k's, so the pieces merge as cl100k merges them.
// usage: node megatron_tiktoken_vocab.js FIXTURES_DIR OUT.json
'use strict';
const fs = require('fs');
const path = require('path');
const [fixtures, out] = process.argv.slice(2);
const tiktoken = require(path.join(path.resolve(fixtures), 'node_modules', 'tiktoken'));
const encoding = tiktoken.get_encoding('cl100k_base');
const longer = [];
for (let rank = 0; rank < 100256; ++rank) {
  const bytes = encoding.decode_single_token_bytes(rank);
  if (bytes.length > 1) longer.push(Buffer.from(bytes));
}
encoding.free();
const tokens = [...Array.from({ length: 256 }, (_, b) => Buffer.from([b])), ...longer];
const vocab = tokens.map((bytes, rank) => ({
  rank,
  token_bytes: bytes.toString('base64'),
  token_str: bytes.toString('utf8'),
}));
fs.writeFileSync(out, JSON.stringify(vocab));
