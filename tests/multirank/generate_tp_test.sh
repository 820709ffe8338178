#!/usr/bin/env bash
# `megatron generate` itself under mpirun. A tiny model is trained and saved by one process
# (TP = 1); `generate` with -np 2 (TP = 2: the world size by default, and named explicitly) must
# print exactly what one process prints, greedy and sampled (the same seed on every rank; the
# library test, test_tp_generate.cpp, proves the token-by-token agreement in f64, this run checks
# the command's wiring in f32). A checkpoint trained at PP = 2 (layers saved under their global
# numbers) generates at -np 1 and 2 too, and has learnt the same counting. Then layouts the model
# cannot take must fail, naming the rule.
# usage: [DEVICE=cuda] generate_tp_test.sh MEGATRON MPIRUN [MPIRUN FLAGS...]   (DEVICE: cpu by default;
# the multigpu label runs it with cuda, one GPU per rank)
set -u
device=${DEVICE:-cpu}
megatron=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
model=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
  --global-batch-size 4 --lr 3e-3 --train-iters 200 --log-interval 200 --mock-data
  --tokenizer-type NullTokenizer --device "$device")
train() { # train DIR [LAUNCHER... --] [FLAGS...]
  local out=$1 launcher=()
  shift
  if [[ " $* " == *" -- "* ]]; then
    while [ "$1" != -- ]; do
      launcher+=("$1")
      shift
    done
    shift
  fi
  "${launcher[@]}" "$megatron" train "${model[@]}" --save "$out" --save-interval 200 "$@" >"$dir/train.log" 2>&1 || {
    cat "$dir/train.log"
    fail "training the tiny model failed"
  }
}
ckpt=$dir/ckpt
train "$ckpt" --vocab-size 100

# 200 iterations teach the model the mock data's counting sequences: it counts on from 59, across
# the boundary between the two ranks' vocabulary shards at 64.
greedy=(--prompt "57 58 59" --max-new-tokens 20 --temperature 0 --device "$device")
sampled=(--prompt "57 58 59" --max-new-tokens 20 --temperature 0.8 --top-k 20 --num-samples 2 --seed 3 --device "$device")
# generate NAME [LAUNCHER...] -- [FLAGS...]: $ckpt's samples; stdout to $dir/NAME.out, everything to $dir/NAME.log.
generate() {
  local name=$1 launcher=()
  shift
  while [ "$1" != -- ]; do
    launcher+=("$1")
    shift
  done
  shift
  timeout -k 5 60 "${launcher[@]}" "$megatron" generate --load "$ckpt" "$@" >"$dir/$name.out" 2>"$dir/$name.err"
  local rc=$?
  cat "$dir/$name.out" "$dir/$name.err" >"$dir/$name.log"
  return $rc
}
expect_same() { # expect_same NAME REFERENCE
  cmp -s "$dir/$1.out" "$dir/$2.out" || {
    diff "$dir/$2.out" "$dir/$1.out"
    cat "$dir/$1.log"
    fail "$1 printed something else than $2"
  }
}

generate greedy_np1 -- "${greedy[@]}" || fail "one process: $(cat "$dir/greedy_np1.log")"
grep -q -- "----- sample 1 -----" "$dir/greedy_np1.out" || fail "one process printed no sample"
generate greedy_np2 "$@" -np 2 -- "${greedy[@]}" || fail "-np 2: $(cat "$dir/greedy_np2.log")"
expect_same greedy_np2 greedy_np1
generate greedy_np2_flag "$@" -np 2 -- "${greedy[@]}" --tensor-model-parallel-size 2 ||
  fail "-np 2 --tensor-model-parallel-size 2: $(cat "$dir/greedy_np2_flag.log")"
expect_same greedy_np2_flag greedy_np1
generate sampled_np1 -- "${sampled[@]}" || fail "one process, sampled: $(cat "$dir/sampled_np1.log")"
generate sampled_np2 "$@" -np 2 -- "${sampled[@]}" || fail "-np 2, sampled: $(cat "$dir/sampled_np2.log")"
expect_same sampled_np2 sampled_np1

# The same model trained over two pipeline stages: generation builds the whole model and reads
# each layer by its global name.
ckpt=$dir/pp2
train "$ckpt" "$@" -np 2 -- --vocab-size 100 --pipeline-model-parallel-size 2
generate greedy_pp2_np1 -- "${greedy[@]}" || fail "PP=2 checkpoint, one process: $(cat "$dir/greedy_pp2_np1.log")"
expect_same greedy_pp2_np1 greedy_np1
generate greedy_pp2_np2 "$@" -np 2 -- "${greedy[@]}" || fail "PP=2 checkpoint, -np 2: $(cat "$dir/greedy_pp2_np2.log")"
expect_same greedy_pp2_np2 greedy_np1

# expect_failure NAME NEEDLE LAUNCHER... -- FLAGS...
expect_failure() {
  local name=$1 needle=$2
  shift 2
  generate "$name" "$@" && fail "$name exited 0: $(cat "$dir/$name.log")"
  grep -q -F -- "$needle" "$dir/$name.log" || {
    cat "$dir/$name.log"
    fail "$name: the error does not say '$needle'"
  }
}
launch=("$@")
expect_failure tp_not_world "--tensor-model-parallel-size 1 differs from the 2 launched rank(s)" \
  "${launch[@]}" -np 2 -- "${greedy[@]}" --tensor-model-parallel-size 1
expect_failure heads "--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 3" \
  "${launch[@]}" -np 3 -- "${greedy[@]}"
# Padded to 99 rows (--make-vocab-size-divisible-by 1): no TP = 2 split.
ckpt=$dir/odd_vocab
train "$ckpt" --vocab-size 99 --make-vocab-size-divisible-by 1
expect_failure vocab "(99 rows) is not divisible by --tensor-model-parallel-size 2" \
  "${launch[@]}" -np 2 -- "${greedy[@]}"
echo "PASS: -np 2 prints what one process prints (greedy and sampled), from a PP = 1 and a PP = 2 checkpoint; bad layouts are named"
