#!/usr/bin/env bash
# --tensorboard-dir: the event file `megatron train` writes is read back by an independent reader
# (tests/tensorboard_oracle/read_events.js: npm protobufjs decoding TensorBoard's Event message,
# npm crc-32's CRC-32C checking the framing), and every scalar equals the value the metrics file
# logged for the same iteration, rounded to float as TensorBoard's simple_value holds it: lm loss,
# learning-rate, grad-norm, num-zeros (--log-num-zeros-in-grad), params-norm (--log-params-norm), loss-scale,
# batch-size, world-size (each also "vs samples" at the
# consumed samples), iteration-time, throughput, skipped-iterations, nan-iterations,
# mem-max-allocated-bytes (the metrics' peak memory), lm loss validation (and its perplexity) and
# lm loss test; mem-allocated-bytes and mem-reserved-bytes, which the metrics file does not hold,
# are checked to be positive, equal (the CPU allocator caches nothing) and at most the peak, and
# mem-allocated-count to be a positive whole number (of blocks handed out). With
# --timing-log-level 1, Megatron's "<timer>-time" scalars (forward-backward, all-grads-sync,
# optimizer) equal the timer lines the log printed after each log line (ms, two decimals) in seconds.
# The fp16 run starts at a loss scale of 2^20, where one step overflows (skipped: no grad norm, no
# zero count) and the others update (both written).
# usage: tensorboard_test.sh MEGATRON FIXTURES_DIR
set -u
megatron=$1
fixtures=$2
oracle=$(dirname "$0")/../tensorboard_oracle/read_events.js
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
[ -d "$fixtures/node_modules/protobufjs" ] || fail "$fixtures/node_modules/protobufjs is missing: run scripts/fetch-fixtures.sh"
"$megatron" train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 \
  --global-batch-size 4 --lr 1e-3 --lr-warmup-iters 2 --mock-data --tokenizer-type NullTokenizer --vocab-size 100 \
  --device cpu --train-iters 6 --log-interval 1 --eval-interval 3 --eval-iters 1 --fp16 --initial-loss-scale 1048576 \
  --metrics-file "$dir/metrics.jsonl" --tensorboard-dir "$dir/tb" --tensorboard-queue-size 7 \
  --log-timers-to-tensorboard --log-validation-ppl-to-tensorboard --log-world-size-to-tensorboard --log-throughput \
  --log-memory-to-tensorboard --timing-log-level 1 --log-params-norm --log-num-zeros-in-grad \
  >"$dir/log" 2>&1 || fail "training failed: $(cat "$dir/log")"
files=("$dir"/tb/events.out.tfevents.*)
[ "${#files[@]}" -eq 1 ] && [ -f "${files[0]}" ] || fail "expected one event file in $dir/tb: ${files[*]}"
node "$oracle" "$fixtures" "${files[0]}" >"$dir/scalars.jsonl" || fail "the reader rejected ${files[0]}"
node - "$dir/metrics.jsonl" "$dir/scalars.jsonl" "$dir/log" <<'JS' || fail "the event file disagrees with the metrics file"
'use strict';
const fs = require('fs');
const lines = (file) => fs.readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const [metrics, scalars] = process.argv.slice(2, 4).map(lines);
// The timer blocks the log printed, one per log line in order: name -> max ms.
const timerBlocks = fs.readFileSync(process.argv[4], 'utf8').split('(min, max) time across ranks (ms):').slice(1)
  .map((block) => Object.fromEntries([...block.matchAll(/^    ([a-z-]+) \.+: \(([0-9.]+), ([0-9.]+)\)$/gm)]
    .map((m) => [m[1], Number(m[3])])));
const byTag = {};
for (const s of scalars) (byTag[s.tag] = byTag[s.tag] || []).push(s);
let problems = 0, checked = 0;
// Float values must be exact (both round the same double to float); the perplexity is computed by
// two exp implementations, which may differ in the last bit of the double: 1e-6 relative.
const expect = (tag, step, value, index = 0, tolerance = 0) => {
  const found = (byTag[tag] || []).filter((s) => s.step === step);
  const want = Math.fround(value);
  checked += 1;
  if (found.length <= index || Math.abs(found[index].value - want) > tolerance * Math.abs(want)) {
    console.error(`${tag} at step ${step}: expected ${want}, found ${JSON.stringify(found)}`);
    problems += 1;
  }
};
const both = (tag, m, value) => {
  expect(tag, m.iteration, value);
  expect(tag + ' vs samples', m.consumed_samples, value);
};
let trainLines = 0;
const validationsAt = {};
const consumedAt = {};
for (const m of metrics) if (m.kind === 'train') consumedAt[m.iteration] = m.consumed_samples;
for (const m of metrics) {
  if (m.kind === 'train') {
    both('lm loss', m, m.lm_loss);
    both('learning-rate', m, m.learning_rate);
    both('loss-scale', m, m.loss_scale);
    both('batch-size', m, m.global_batch_size);
    both('world-size', m, 1);
    if (m.grad_norm !== null) both('grad-norm', m, m.grad_norm);
    if (m.num_zeros_in_grad !== undefined) both('num-zeros', m, m.num_zeros_in_grad);  // absent on a skipped step
    if (typeof m.params_norm !== 'number') {
      console.error(`iteration ${m.iteration}: the metrics file holds no params_norm`);
      problems += 1;
    } else {
      both('params-norm', m, m.params_norm);
    }
    expect('iteration-time', m.iteration, m.elapsed_ms_per_iteration * 1e-3);
    const printed = timerBlocks[trainLines++] || {};
    for (const name of ['forward-backward', 'all-grads-sync', 'optimizer']) {
      const found = (byTag[name + '-time'] || []).filter((s) => s.step === m.iteration);
      checked += 1;
      // The log rounds to 0.01 ms; the scalar is a float of the seconds.
      if (found.length !== 1 || !(name in printed) || Math.abs(found[0].value * 1e3 - printed[name]) > 0.0051) {
        console.error(`${name}-time at ${m.iteration}: ${JSON.stringify(found)}, the log printed ${printed[name]} ms`);
        problems += 1;
      }
    }
    expect('throughput', m.iteration, m.tflops_per_gpu);
    expect('skipped-iterations', m.iteration, m.skipped_iterations);
    expect('nan-iterations', m.iteration, m.nan_iterations);
    const peak = m.peak_memory_mib * 1048576;
    expect('mem-max-allocated-bytes', m.iteration, peak);
    const at = (tag) => (byTag[tag] || []).filter((s) => s.step === m.iteration);
    const [allocated, reserved, count] = [at('mem-allocated-bytes'), at('mem-reserved-bytes'),
                                          at('mem-allocated-count')];
    checked += 3;
    if (count.length !== 1 || !Number.isInteger(count[0].value) || !(count[0].value > 0)) {
      console.error(`allocation count at ${m.iteration}: ${JSON.stringify(count)}`);
      problems += 1;
    }
    if (allocated.length !== 1 || reserved.length !== 1 || !(allocated[0].value > 0) ||
        allocated[0].value !== reserved[0].value || allocated[0].value > Math.fround(peak)) {
      console.error(`memory at ${m.iteration}: allocated ${JSON.stringify(allocated)}, reserved ` +
                    `${JSON.stringify(reserved)}, peak ${peak}`);
      problems += 1;
    }
  } else {
    const tag = 'lm loss ' + m.kind;
    const index = (validationsAt[tag + m.iteration] = (validationsAt[tag + m.iteration] || 0) + 1) - 1;
    const ppl = Math.exp(Math.min(20, m.lm_loss));
    expect(tag, m.iteration, m.lm_loss, index);
    expect(tag + ' vs samples', consumedAt[m.iteration], m.lm_loss, index);
    expect(tag + ' ppl', m.iteration, ppl, index, 1e-6);
    expect(tag + ' ppl vs samples', consumedAt[m.iteration], ppl, index, 1e-6);
  }
}
if (scalars.length !== checked) {
  console.error(`the event file holds ${scalars.length} scalars, ${checked} were expected`);
  problems += 1;
}
console.log(`${checked} scalars checked, ${problems} problems`);
process.exit(problems ? 1 : 0);
JS
echo "PASS: the event file read back equals the metrics"
