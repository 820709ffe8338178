# shellcheck shell=bash disable=SC2154  # base: the sourcing script's
# Sourced by the multirank tests that train on CPU ranks, with their arguments (MEGATRON MPIRUN
# [MPIRUN FLAGS...]): sets megatron, mpirun, a scratch dir removed on exit and status (0 until a
# check fails), and defines (for tests that train with a $base command line)
#   run NAME RANKS FLAGS...: `megatron train $base FLAGS`, on RANKS ranks under mpirun when more
#     than one, saving to $dir/NAME, metrics in $dir/NAME.jsonl, log appended to $dir/NAME.log; a
#     failure is reported and sets status;
#   same_weights A B ITER: whether every model file A's checkpoint of iteration ITER holds equals
#     B's, byte for byte.
set -u
megatron=$1
shift
mpirun=("$@")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
status=0
run() {
  local name=$1 ranks=$2
  shift 2
  local launch=()
  [ "$ranks" -gt 1 ] && launch=("${mpirun[@]}" -np "$ranks")
  # shellcheck disable=SC2086
  timeout -k 5 120 "${launch[@]}" "$megatron" train $base "$@" --save "$dir/$name" --metrics-file "$dir/$name.jsonl" \
    >>"$dir/$name.log" 2>&1 || { echo "FAIL: $name: $(tail -5 "$dir/$name.log")"; status=1; }
}
same_weights() {
  local iter f
  iter=$(printf 'iter_%07d' "$3")
  for f in "$dir/$1/$iter"/model_rank_*.safetensors; do
    cmp -s "$f" "$dir/$2/$iter/$(basename "$f")" || return 1
  done
}
