// An independent reader of TensorBoard event files: TFRecord framing checked with the npm
// `crc-32` package's CRC-32C (masked as TensorFlow masks it), each record decoded by the npm
// `protobufjs` package from event.proto. Prints one JSON line per scalar: {"tag", "step", "value"};
// fails on a bad CRC, a truncated record or a first event that is not file_version brain.Event:2.
// usage: node read_events.js FIXTURES_DIR EVENT_FILE
'use strict';
const fs = require('fs');
const path = require('path');

const [fixtures, eventFile] = process.argv.slice(2);
if (!eventFile) {
  console.error('usage: node read_events.js FIXTURES_DIR EVENT_FILE');
  process.exit(2);
}
const load = (name) => require(path.join(path.resolve(fixtures), 'node_modules', name));
const protobuf = load('protobufjs');
const crc32c = load('crc-32/crc32c');

const Event = protobuf.loadSync(path.join(__dirname, 'event.proto')).lookupType('tensorboard.Event');
const masked = (bytes) => {
  const crc = crc32c.buf(bytes) >>> 0;
  return ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;
};
const fail = (why) => {
  console.error(eventFile + ': ' + why);
  process.exit(1);
};

const data = fs.readFileSync(eventFile);
let at = 0;
let records = 0;
while (at < data.length) {
  if (at + 12 > data.length) fail('truncated record header at byte ' + at);
  const lengthBytes = data.subarray(at, at + 8);
  const length = Number(data.readBigUInt64LE(at));
  if (data.readUInt32LE(at + 8) !== masked(lengthBytes)) fail('bad length CRC at byte ' + at);
  const body = data.subarray(at + 12, at + 12 + length);
  if (body.length !== length || at + 16 + length > data.length) fail('truncated record at byte ' + at);
  if (data.readUInt32LE(at + 12 + length) !== masked(body)) fail('bad data CRC at byte ' + at);
  const event = Event.toObject(Event.decode(body), { longs: String });
  if (records === 0 && event.fileVersion !== 'brain.Event:2') fail('the first event is not file_version brain.Event:2');
  if (event.summary)
    for (const value of event.summary.value)
      console.log(JSON.stringify({ tag: value.tag, step: Number(event.step || 0), value: value.simpleValue }));
  at += 16 + length;
  records += 1;
}
