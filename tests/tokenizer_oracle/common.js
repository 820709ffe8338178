// Shared by the oracle scripts: argv is <fixtures dir> <documents.json> <ids.txt>. The JSON
// file holds an array of strings; each is encoded on its own and its ids are written as one
// line of space-separated integers, in order.
'use strict';
const fs = require('fs');
const path = require('path');

function run(encodeWith) {
  const [fixtures, documentsFile, idsFile] = process.argv.slice(2);
  if (!idsFile) {
    console.error('usage: node ' + path.basename(process.argv[1]) + ' FIXTURES_DIR DOCUMENTS.json IDS.txt');
    process.exit(2);
  }
  const load = (name) => require(path.join(path.resolve(fixtures), 'node_modules', name));
  const encode = encodeWith(load);
  const documents = JSON.parse(fs.readFileSync(documentsFile, 'utf8'));
  const lines = documents.map((text) => Array.from(encode(text)).join(' '));
  fs.writeFileSync(idsFile, lines.join('\n') + '\n');
}

module.exports = { run };
