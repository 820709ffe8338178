#!/usr/bin/env bash
# The launch examples (examples/), run as written on CPU ranks at tiny sizes:
# - examples/slurm_train.sbatch is executed by bash with the environment sbatch gives it
#   (SLURM_JOB_ID) and a fake `srun` first on PATH, which drops srun's own options and starts the
#   command under MPIRUN -np 2. Its #SBATCH lines must give one task per GPU and a TP that fits in a
#   node.
# - examples/k8s_mpijob.yaml is read as YAML (python3's yaml): a kubeflow.org/v2beta1 MPIJob with
#   one launcher, whose mpirun lines start workers x slotsPerWorker ranks, one GPU per slot, and a TP
#   that fits in a worker; its doctor and train commands run under MPIRUN -np 2, /data/ being a
#   local directory.
# Only sizes shrink (the model preset, TP, batch, sequence, iterations or samples and the intervals
# that count them; the table in run_small), so every flag the examples pass must exist and every
# combination they use must run: the doctor passes, training reaches its last iteration, saves
# (async), keeps local non-persistent checkpoints, writes TensorBoard events.
# usage: examples_test.sh EXAMPLES_DIR MEGATRON TOKENIZER_JSON MPIRUN [MPIRUN FLAGS...]
set -u
examples=$(realpath "$1") megatron=$(realpath "$2") tokenizer=$(realpath "$3")
shift 3
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export MEGATRON_UNDER_TEST=$megatron MPIRUN_UNDER_TEST
MPIRUN_UNDER_TEST=$(printf '%q ' "$@")

# A launcher's command (EXECUTABLE SUBCOMMAND FLAGS...) at tiny sizes under MPIRUN -np 2: the
# flags listed get small values, every other flag passes unchanged.
run_small() {
  local sub=$2 out=() flag
  shift 2
  while [ $# -gt 0 ]; do
    flag=$1
    shift
    case "$flag" in
    --model-preset) out+=("$flag" llama-tiny) && shift ;;
    --tensor-model-parallel-size) out+=("$flag" 2) && shift ;;
    --global-batch-size) out+=("$flag" 4) && shift ;;
    --seq-length) out+=("$flag" 32) && shift ;;
    --train-samples) out+=("$flag" 48) && shift ;;
    --train-iters) out+=("$flag" 16) && shift ;;
    --rampup-batch-size) out+=("$flag" 2 2 16) && shift 3 ;;
    --lr-warmup-samples) out+=("$flag" 8) && shift ;;
    --lr-warmup-iters) out+=("$flag" 2) && shift ;;
    --save-interval | --eval-interval) out+=("$flag" 6) && shift ;;
    --non-persistent-save-interval) out+=("$flag" 4) && shift ;;
    --eval-iters) out+=("$flag" 1) && shift ;;
    *) out+=("$flag") ;;
    esac
  done
  echo "+ mpirun -np 2 megatron $sub ${out[*]}"
  eval "timeout -k 5 240 $MPIRUN_UNDER_TEST -np 2 \"\$MEGATRON_UNDER_TEST\" \"\$sub\" \"\${out[@]}\""
}
export -f run_small

# Data both examples train on: the tokenizer's own text, tokenized with it.
mkdir -p "$work/data/tokenizer" "$work/bin"
cp "$tokenizer" "$work/data/tokenizer/tokenizer.json"
for i in $(seq 1 200); do
  printf '{"text": "Document %d: the quick brown fox jumps over the lazy dog, and Megatron trains it %d times."}\n' \
    "$i" "$i"
done >"$work/corpus.jsonl"
"$megatron" preprocess-data --input "$work/corpus.jsonl" --output-prefix "$work/data/corpus" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$work/data/tokenizer/tokenizer.json" --append-eod \
  >"$work/preprocess.log" 2>&1 || fail "preprocess-data: $(cat "$work/preprocess.log")"

# A run's results: the last iteration saved under CKPT, TensorBoard events, each rank's local
# checkpoint.
check_run() {
  local what=$1 ckpt=$2 local_dir=$3 log=$4
  grep -q "iteration *16/ *16" "$log" || fail "$what: no log line of iteration 16: $(tail -30 "$log")"
  [ "$(cat "$ckpt/latest_checkpointed_iteration.txt" 2>/dev/null)" = 16 ] || fail "$what: $ckpt holds no iteration 16"
  compgen -G "$ckpt/tensorboard/events.out.tfevents.*" >/dev/null || fail "$what: no TensorBoard events in $ckpt"
  if [ -n "$local_dir" ]; then
    [ -d "$local_dir/rank_00000" ] && [ -d "$local_dir/rank_00001" ] || fail "$what: no local checkpoints in $local_dir"
  fi
  grep -q "all checks passed" "$log" || fail "$what: the doctor did not pass: $(head -30 "$log")"
}

# --- Slurm ---
sbatch=$examples/slurm_train.sbatch
sbatch_value() { sed -n "s/^#SBATCH --$1=//p" "$sbatch"; }
[ "$(sbatch_value ntasks-per-node)" = "$(sbatch_value gpus-per-node)" ] ||
  fail "$sbatch: --ntasks-per-node $(sbatch_value ntasks-per-node) differs from --gpus-per-node $(sbatch_value gpus-per-node): one rank per GPU"
tp=$(grep -o -- '--tensor-model-parallel-size [0-9]*' "$sbatch" | cut -d' ' -f2)
[ $(($(sbatch_value ntasks-per-node) % tp)) -eq 0 ] || fail "$sbatch: TP $tp does not divide the tasks of a node"
cat >"$work/bin/srun" <<'EOF'
#!/usr/bin/env bash
# srun for the test: its own options dropped, the command run at tiny sizes under mpirun.
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
run_small "$@"
EOF
chmod +x "$work/bin/srun"
(cd "$work" && PATH="$work/bin:$PATH" SLURM_JOB_ID=4242 MEGATRON="$megatron" DATA="$work/data/corpus_text_document" \
  TOKENIZER_JSON="$work/data/tokenizer/tokenizer.json" CKPT="$work/slurm-ckpt" LOCAL_CKPT="$work/slurm-local" \
  bash "$sbatch") >"$work/slurm.log" 2>&1 || fail "$sbatch failed: $(tail -40 "$work/slurm.log")"
check_run "$sbatch" "$work/slurm-ckpt" "$work/slurm-local" "$work/slurm.log"
echo "PASS: $sbatch"

# --- Kubernetes MPIJob ---
manifest=$examples/k8s_mpijob.yaml
python3 - "$manifest" "$work" >"$work/mpijob.commands" <<'PY' || fail "$manifest: $(cat "$work/mpijob.commands")"
import re, shlex, sys
import yaml
path, work = sys.argv[1], sys.argv[2]
job = yaml.safe_load(open(path))
def need(ok, what):
    if not ok:
        print(f"{path}: {what}")
        sys.exit(1)
need(job.get("apiVersion") == "kubeflow.org/v2beta1" and job.get("kind") == "MPIJob", "not a kubeflow.org/v2beta1 MPIJob")
spec = job["spec"]
replicas = spec["mpiReplicaSpecs"]
launcher, worker = replicas["Launcher"], replicas["Worker"]
need(launcher["replicas"] == 1, "an MPIJob has one launcher")
slots, workers = spec["slotsPerWorker"], worker["replicas"]
gpus = worker["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
need(gpus == slots, f"slotsPerWorker {slots} but {gpus} GPUs per worker: one rank per GPU")
mounts = [m["mountPath"] for m in worker["template"]["spec"]["containers"][0].get("volumeMounts", [])]
need("/data" in mounts, "the workers, where the ranks run, do not mount /data")
container = launcher["template"]["spec"]["containers"][0]
need(container["command"] == ["bash", "-c"] and len(container["args"]) == 1, "the launcher runs one bash -c line")
for command in container["args"][0].split("&&"):
    argv = shlex.split(command.replace("/data/", work + "/data/"))
    need(argv[0] == "mpirun", f"not an mpirun command: {command}")
    np = int(argv[argv.index("-np") + 1])
    need(np == workers * slots, f"mpirun -np {np} but {workers} workers x {slots} slots")
    exe = next(i for i, a in enumerate(argv) if a.endswith("/megatron"))
    if "--tensor-model-parallel-size" in argv:
        tp = int(argv[argv.index("--tensor-model-parallel-size") + 1])
        need(slots % tp == 0, f"TP {tp} does not fit in a worker's {slots} slots")
    print(shlex.join(argv[exe:]))
PY
[ "$(wc -l <"$work/mpijob.commands")" -eq 2 ] || fail "$manifest: expected a doctor and a train command"
while IFS= read -r command; do
  eval "set -- $command"
  # stdin from /dev/null: mpirun would read the rest of the command list.
  (cd "$work" && run_small "$@" </dev/null) >>"$work/mpijob.log" 2>&1 ||
    fail "$manifest: '$command' failed: $(tail -40 "$work/mpijob.log")"
done <"$work/mpijob.commands"
check_run "$manifest" "$work/data/checkpoints/llama3-8b" "" "$work/mpijob.log"
echo "PASS: $manifest"
