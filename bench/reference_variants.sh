#!/usr/bin/env bash
# The PyTorch reference (bench/pytorch_reference.py) in its previous form (legacy), its default
# (tuned), and tuned with one choice changed at a time, on one preset and micro-batch, each in a
# fresh process on the same GPU: the search for the strongest fair reference, in one device call.
# Rows run in order of interest, each under a timeout, until a time budget is spent (the rest are
# listed as not run), so the call always ends with the table, printed last: ms per iteration,
# tokens/s, peak memory, the loss after the run (the same model maths give about the same loss),
# and tokens/s against legacy. A row compiles the whole model anew (about a minute or two for
# llama-1b; the max-autotune rows autotune every GEMM shape, many minutes, so they come last and
# may need a call of their own: pass the rows to run, e.g. "0,9"). Inductor's on-disk cache
# (/tmp/torchinductor_$USER) keeps finished compilations and autotuning for a later call on the
# same machine. Logs go to $OUT (or /tmp/reference-variants).
# Usage: bench/reference_variants.sh [preset:micro_batch] [budget_seconds] [rows]
#        (defaults: llama-1b:8, 480, every row)
set -uo pipefail
cd "$(dirname "$0")/.."
run="${1:-llama-1b:8}"
budget="${2:-480}"
only="${3:-}"
preset="${run%%:*}" mbs="${run##*:}"
out="${OUT:-/tmp/reference-variants}"
mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"

# name|flags, numbered from 0. Every row computes the same model (pytorch_reference.py, CHOICES),
# except that row 9 lets cuBLAS reduce in bf16: it shows what PyTorch's default is worth, and is no
# candidate (megatron-cpp accumulates in fp32).
variants=(
  "legacy (the reference before)|--variant legacy"
  "tuned (the default)|"
  "tuned, GQA by expanding k and v|--gqa expand"
  "tuned, SDPA backend PyTorch's choice|--sdpa auto"
  "tuned, fp32 residual stream|--residual fp32"
  "tuned, RMSNorm by hand|--rms-norm manual"
  "tuned, RoPE tables fp32 per step|--rope fp32-per-step"
  "tuned, SDPA flash only|--sdpa flash"
  "tuned + coordinate-descent tuning|--coordinate-descent-tuning on"
  "tuned + bf16 split-K reductions (not our maths)|--reduced-precision-reduction torch-default"
  "tuned + max-autotune-no-cudagraphs|--compile-mode max-autotune-no-cudagraphs"
  "tuned + max-autotune (CUDA graphs)|--compile-mode max-autotune"
)

start=$(date +%s)
for i in "${!variants[@]}"; do
  name="${variants[$i]%%|*}" flags="${variants[$i]#*|}"
  [ -z "$only" ] || [[ ",$only," == *",$i,"* ]] || continue
  left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt 45 ]; then
    echo "{\"row\": $i, \"name\": \"$name\", \"status\": \"not run (time budget)\"}" >> "$results"
    continue
  fi
  limit=$((left < 240 ? left : 240))
  log="$out/variant-$i.log"
  echo "== $name: $flags (limit ${limit}s)" >&2
  # shellcheck disable=SC2086  # flags are words
  line=$(timeout -k 10 "$limit" python3 bench/pytorch_reference.py --preset "$preset" --micro-batch-size "$mbs" \
    --warmup 3 --iters 15 $flags 2> "$log" | tail -1)
  rc=$?
  if [ $rc -eq 0 ] && [ -n "$line" ]; then
    echo "{\"row\": $i, \"name\": \"$name\", \"status\": \"ok\", \"result\": $line}" >> "$results"
  else
    [ $rc -eq 124 ] && why="timed out after ${limit}s" || why="failed (exit $rc), see $log"
    echo "{\"row\": $i, \"name\": \"$name\", \"status\": \"$why\"}" >> "$results"
    tail -3 "$log" >&2
  fi
done

python3 - "$results" "$preset" "$mbs" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = next((r["result"]["tokens_per_second"] for r in rows if r["row"] == 0 and r["status"] == "ok"), None)
first = next((r["result"] for r in rows if r["status"] == "ok"), {})
print()
print(f"PyTorch reference variants, {sys.argv[2]} micro-batch {sys.argv[3]}, torch {first.get('torch', '?')}")
print("| variant | ms/it | tokens/s | peak GiB | loss | vs legacy |")
print("|---|---|---|---|---|---|")
for r in rows:
    if r["status"] != "ok":
        print(f"| {r['name']} | {r['status']} | | | | |")
        continue
    x = r["result"]
    ratio = f"{x['tokens_per_second'] / base:.3f}x" if base else "-"
    print(f"| {r['name']} | {x['ms_per_iteration']:.1f} | {x['tokens_per_second']} | {x['peak_memory_gib']:.2f} "
          f"| {x['loss']:.4f} | {ratio} |")
EOF
