#!/usr/bin/env bash
# The README's "Train on your own data" recipe, run as written: its commands are read from
# README.md itself, so a README change that no longer works fails here. Only the sizes shrink
# (model, batch, iterations) so that it runs in seconds on a CPU; every command must succeed. Then
# the checkpoint directory is moved away from the tokenizer's files and `generate` must print the
# same text from there (the checkpoint holds its tokenizer).
# usage: readme_recipe_test.sh README.md MEGATRON FIXTURES_DIR MPIRUN [MPIRUN FLAGS...]
#   FIXTURES_DIR holds gpt2/vocab.json and gpt2/merges.txt (scripts/fetch-fixtures.sh);
#   MPIRUN with its flags replaces the recipe's `mpirun` (as root it needs --allow-run-as-root).
set -u
readme=$(realpath "$1") megatron=$(realpath "$2") fixtures=$(realpath "$3")
shift 3
mpirun=("$@")
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
for f in vocab.json merges.txt; do
  [ -f "$fixtures/gpt2/$f" ] || fail "$fixtures/gpt2/$f is missing: run scripts/fetch-fixtures.sh"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The first bash block after the section's heading, continuation lines joined.
commands=$(awk '
  /^## / { in_section = ($0 == "## Train on your own data") }
  in_section && /^```bash/ { in_block = 1; next }
  in_block && /^```/ { exit }
  in_block { if (sub(/\\$/, "")) { line = line $0 } else { print line $0; line = "" } }' "$readme")
[ -n "$commands" ] || fail "no bash block under '## Train on your own data' in $readme"

# Small sizes for the flags the recipe sets (a flag it drops keeps the recipe's meaning).
shrink() {
  local line=$1 flag value
  while read -r flag value; do
    line=$(sed -E "s/(^| )$flag [^ ]+/\1$flag $value/" <<<"$line")
  done <<'EOF'
--num-layers 2
--hidden-size 64
--num-attention-heads 4
--seq-length 32
--micro-batch-size 2
--global-batch-size 4
--train-iters 20
--lr-warmup-iters 2
--eval-interval 10
--eval-iters 2
--save-interval 10
--workers 2
EOF
  echo "$line"
}

# The user's own data: documents of a few sentences, and GPT-2's tokenizer files.
cd "$work" || fail "cannot enter $work"
cp "$fixtures/gpt2/vocab.json" "$fixtures/gpt2/merges.txt" .
for i in $(seq 1 300); do
  printf '{"text": "Story %d. Once upon a time a fox met a dog by the river, and the dog said hello. The fox ran off into the woods %d times."}\n' "$i" "$i"
done >corpus.jsonl

generate_lines=()
n=0
while IFS= read -r command; do
  [ -n "$command" ] || continue
  n=$((n + 1))
  case "$command" in
  "scripts/build.sh release")
    # The binary under test is that build's output; the build itself is the suite's build.
    continue
    ;;
  mkdir\ *) run=$command ;;
  build/release/megatron\ *) run="\"\$megatron\"${command#build/release/megatron}" ;;
  mpirun\ *build/release/megatron\ *)
    run="\"\${mpirun[@]}\"${command#mpirun}"
    run=${run/build\/release\/megatron/\"\$megatron\"}
    ;;
  *) fail "the recipe's command '$command' is not one this test knows how to run; teach $0" ;;
  esac
  run=$(shrink "$run")
  echo "+ $run"
  eval "$run" >"out.$n" 2>"err.$n" </dev/null || {
    cat "out.$n" "err.$n"
    fail "the README's command '$command' failed (run as: $run)"
  }
  case "$command" in *" generate "*) generate_lines+=("$n:$run") ;; esac
done <<<"$commands"
[ "${#generate_lines[@]}" -ge 2 ] || fail "the recipe has ${#generate_lines[@]} generate commands; expected one and an mpirun one"
for entry in "${generate_lines[@]}"; do
  grep -q -- "----- sample 1 -----" "out.${entry%%:*}" ||
    fail "'${entry#*:}' printed no sample: $(cat "out.${entry%%:*}" "err.${entry%%:*}")"
done

# Another machine: the checkpoint directory elsewhere, no tokenizer files in sight.
load=$(grep -o -- '--load [^ ]*' <<<"${generate_lines[0]#*:}" | cut -d' ' -f2)
[ -d "$load" ] || fail "the generate line's --load $load is not the directory training saved to"
mkdir moved && mv "$load" moved/ && rm vocab.json merges.txt
first=${generate_lines[0]}
moved=${first#*:}
moved=${moved/--load $load/--load $work/moved/$load}
(cd / && eval "$moved") >out.moved 2>err.moved </dev/null || {
  cat out.moved err.moved
  fail "generate from the moved checkpoint failed: $moved"
}
cmp -s "out.${first%%:*}" out.moved || {
  diff "out.${first%%:*}" out.moved
  fail "generate printed other text from the moved checkpoint"
}
echo "PASS: the README's recipe runs as written; its checkpoint generates the same text after a move"
