#!/usr/bin/env bash
# --async-save (training/async_checkpoint.h), one process:
#  1. the files of an asynchronous save are a synchronous save's, byte for byte (common.json but
#     for the --async-save flag it records), and training went on while they were written (a save
#     is published after the next iteration's log line at the earliest);
#  2. kill -9 while an asynchronous save is being written (its staging directory present) leaves
#     the previous checkpoint the tracker's, complete, and a run resumes from it.
# usage: async_save_test.sh MEGATRON
set -u
megatron=$1
dir=$(mktemp -d)
job=
cleanup() {
  [ -n "$job" ] && kill -KILL "$job" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
model=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
  --global-batch-size 4 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 100 --device cpu
  --log-interval 1 --train-iters 6 --save-interval 3 --bf16)

# 1. The same run saved both ways, into the same path (common.json records it), then moved aside.
"$megatron" train "${model[@]}" --save "$dir/ckpt" >"$dir/sync.log" 2>&1 || fail "sync run: $(cat "$dir/sync.log")"
mv "$dir/ckpt" "$dir/sync"
"$megatron" train "${model[@]}" --save "$dir/ckpt" --async-save >"$dir/async.log" 2>&1 ||
  fail "async run: $(cat "$dir/async.log")"
mv "$dir/ckpt" "$dir/async"
for iteration in 3 6; do
  name=$(printf 'iter_%07d' $iteration)
  files=$(cd "$dir/sync/$name" && ls | grep -v -x -e metadata.json -e common.json)
  [ -n "$files" ] || fail "no files in $dir/sync/$name"
  for file in $files; do
    cmp "$dir/sync/$name/$file" "$dir/async/$name/$file" || fail "$name/$file differs"
  done
  sed 's/"--async-save": "true"/"--async-save": "false"/' "$dir/async/$name/common.json" |
    cmp - "$dir/sync/$name/common.json" || fail "$name/common.json differs beyond --async-save"
done
[ "$(cat "$dir/async/latest_checkpointed_iteration.txt")" = 6 ] || fail "the async run's tracker is not 6"
saved_line=$(grep -n 'successfully saved checkpoint from iteration 3 ' "$dir/async.log" | cut -d: -f1)
next_line=$(grep -n ' iteration        4/' "$dir/async.log" | cut -d: -f1)
[ -n "$saved_line" ] && [ -n "$next_line" ] && [ "$saved_line" -gt "$next_line" ] ||
  fail "the save of iteration 3 was not published after iteration 4 ran: $(cat "$dir/async.log")"

# 2. A model large enough (about 150 MB of state) that writing it takes a while; killed while the
# files of a save after the first one are being written. Tried a few times in case a save
# publishes between two looks.
big=(--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 16 --micro-batch-size 1
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 1000 --device cpu --log-interval 1
  --save-interval 2 --async-save)
for attempt in 1 2 3 4 5; do
  rm -rf "$dir/big"
  "$megatron" train "${big[@]}" --train-iters 100000 --save "$dir/big" >"$dir/big.log" 2>&1 &
  job=$!
  killed=
  for _ in $(seq 2000); do
    published=$(cat "$dir/big/latest_checkpointed_iteration.txt" 2>/dev/null)
    if [ -n "$published" ] && ls -d "$dir"/big/iter_*.tmp.* >/dev/null 2>&1; then
      kill -KILL "$job"
      killed=$published
      break
    fi
    kill -0 "$job" 2>/dev/null || break
    sleep 0.01
  done
  wait "$job" 2>/dev/null
  job=
  [ -n "$killed" ] || fail "no save was seen in progress: $(cat "$dir/big.log")"
  ls -d "$dir"/big/iter_*.tmp.* >/dev/null 2>&1 && break  # the kill landed inside a save
  echo "attempt $attempt: the save published before the kill; again"
done
ls -d "$dir"/big/iter_*.tmp.* >/dev/null 2>&1 || fail "never killed inside an asynchronous save"
tracked=$(cat "$dir/big/latest_checkpointed_iteration.txt")
"$megatron" train "${big[@]}" --train-iters $((tracked + 1)) --load "$dir/big" >"$dir/resume.log" 2>&1 ||
  fail "resuming after the kill failed: $(cat "$dir/resume.log")"
grep -q "loaded checkpoint from $dir/big at iteration $tracked" "$dir/resume.log" || fail "iteration $tracked not loaded"
echo "PASS: async files equal sync ones; killed inside the save after iteration $killed, which resumed"
