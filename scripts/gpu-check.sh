#!/usr/bin/env bash
# On a GPU machine: configure and build the `gpu` preset (CUDA required, sm_90), run the tests
# labelled gpu, and print a summary table last. Options (any order):
#   --bench [preset:mbs ...]     the single-GPU training benchmark against PyTorch (bench_training.sh)
#   --multigpu                   also the tests labelled multigpu (several GPUs, one rank per GPU)
#   --bench-dp [preset:mbs ...]  the data-parallel benchmark on 4 GPUs (bench/bench_dp.sh)
#   --bench-tp [preset:mbs ...]  tensor (+ sequence) parallelism beside DP on every GPU (bench/bench_tp.sh)
#   --skip-gpu-tests             not the single-GPU tests (when a run before this one did them)
# Logs go to $OUT (the device tool brings them back) or /tmp/gpu-check.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"  # never NVLink multicast on shared machines
out="${OUT:-/tmp/gpu-check}"
mkdir -p "$out"
bench=0 multigpu=0 bench_dp=0 bench_tp=0 gpu_tests=1
bench_runs=() bench_dp_runs=() bench_tp_runs=()
list=""
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 list=bench ;;
    --bench-dp) bench_dp=1 list=bench_dp ;;
    --bench-tp) bench_tp=1 list=bench_tp ;;
    --multigpu) multigpu=1 list="" ;;
    --skip-gpu-tests) gpu_tests=0 list="" ;;
    -*) echo "gpu-check.sh: unknown option $arg (see the header of $0)" >&2; exit 2 ;;
    *)
      case "$list" in
        bench) bench_runs+=("$arg") ;;
        bench_dp) bench_dp_runs+=("$arg") ;;
        bench_tp) bench_tp_runs+=("$arg") ;;
        *) echo "gpu-check.sh: $arg follows no --bench, --bench-dp or --bench-tp" >&2; exit 2 ;;
      esac
      ;;
  esac
done
status() { [ "$1" -eq 0 ] && echo pass || echo "FAIL ($1)"; }

# Debian -dev packages the GPU image lacks (PCRE2, SentencePiece) may travel as .deb files in
# .deps/ (carry it): unpacked under /tmp/deps, never over /, and found through pkg-config.
if ! pkg-config --exists libpcre2-8 sentencepiece 2>/dev/null && ls .deps/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/deps/pkgconfig
  for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
  for pc in /tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
    sed 's#^prefix=/usr#prefix=/tmp/deps/usr#' "$pc" > "/tmp/deps/pkgconfig/$(basename "$pc")"
  done
  export PKG_CONFIG_PATH="/tmp/deps/pkgconfig:${PKG_CONFIG_PATH:-}"
  export LD_LIBRARY_PATH="/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
start=$(date +%s)
cmake --preset gpu > "$out/configure.log" 2>&1 && cmake --build build/gpu -j "$(nproc)" > "$out/build.log" 2>&1
build_rc=$?
build_s=$(( $(date +%s) - start ))
[ $build_rc -eq 0 ] || { tail -30 "$out/configure.log"; grep -E "error|Error" -A3 "$out/build.log" | head -40; }

gpu_rc=0
if [ $gpu_tests -eq 1 ]; then
  # ^gpu$: the label multigpu contains "gpu", and -L takes a regular expression. -V: the passing
  # tests' output too (the training tests print how much of their tolerance they used).
  (cd build/gpu && ctest -L '^gpu$' -V --timeout 600) > "$out/gpu-tests.log" 2>&1
  gpu_rc=$?
  [ $gpu_rc -eq 0 ] || grep -E "Failure|FAILED|Expected|Which is|error" "$out/gpu-tests.log" | head -60
fi

multigpu_rc=0
if [ $multigpu -eq 1 ]; then
  # -V: the passing tests' output too (the DP and TP tests print how much of their tolerance they used).
  (cd build/gpu && ctest -L multigpu -V) > "$out/multigpu-tests.log" 2>&1
  multigpu_rc=$?
  [ $multigpu_rc -eq 0 ] || grep -E "Failure|FAILED|Expected|Which is|error|\\[rank" "$out/multigpu-tests.log" | head -60
fi

bench_rc=0
if [ $bench -eq 1 ] && [ $build_rc -eq 0 ]; then
  OUT="$out" bench/bench_training.sh build/gpu "${bench_runs[@]}" > "$out/bench.txt" 2>&1
  bench_rc=$?
fi

bench_dp_rc=0
if [ $bench_dp -eq 1 ] && [ $build_rc -eq 0 ]; then
  OUT="$out" bench/bench_dp.sh build/gpu "${bench_dp_runs[@]}" > "$out/bench-dp.txt" 2>&1
  bench_dp_rc=$?
fi

bench_tp_rc=0
if [ $bench_tp -eq 1 ] && [ $build_rc -eq 0 ]; then
  OUT="$out" bench/bench_tp.sh build/gpu "${bench_tp_runs[@]}" > "$out/bench-tp.txt" 2>&1
  bench_tp_rc=$?
fi

echo
echo "| step | result | detail |"
echo "|---|---|---|"
echo "| build (gpu preset) | $(status $build_rc) | ${build_s}s |"
if [ $gpu_tests -eq 1 ]; then
  echo "| ctest -L gpu | $(status $gpu_rc) | $(grep -Eo '[0-9]+% tests passed.*' "$out/gpu-tests.log" | head -1) |"
else
  echo "| ctest -L gpu | skipped | --skip-gpu-tests |"
fi
if [ $multigpu -eq 1 ]; then
  echo "| ctest -L multigpu ($(nvidia-smi -L | wc -l) GPUs) | $(status $multigpu_rc) | $(grep -Eo '[0-9]+% tests passed.*' "$out/multigpu-tests.log" | head -1); $(grep -c '(Skipped)' "$out/multigpu-tests.log") skipped |"
fi
if [ $bench -eq 1 ]; then
  echo "| bench | $(status $bench_rc) | $out/bench.txt |"
fi
if [ $bench_dp -eq 1 ]; then
  echo "| bench-dp | $(status $bench_dp_rc) | $out/bench-dp.txt |"
fi
if [ $bench_tp -eq 1 ]; then
  echo "| bench-tp | $(status $bench_tp_rc) | $out/bench-tp.txt |"
fi
if [ $gpu_tests -eq 1 ]; then
  echo
  echo "gpu: largest deviations of training on the GPU from the CPU backend's curve"
  grep -E "GPU vs CPU over|steps skipped, loss scale" "$out/gpu-tests.log" | sed 's/^[0-9]*: //'
fi
if [ $multigpu -eq 1 ]; then
  echo
  echo "multigpu: largest deviations of DP and TP training on GPUs from the single-GPU curve"
  grep "largest relative deviation" "$out/multigpu-tests.log"
fi
if [ $bench -eq 1 ]; then
  echo
  cat "$out/bench.txt"
fi
if [ $bench_dp -eq 1 ]; then
  echo
  cat "$out/bench-dp.txt"
fi
if [ $bench_tp -eq 1 ]; then
  echo
  cat "$out/bench-tp.txt"
fi
[ $build_rc -eq 0 ] && [ $gpu_rc -eq 0 ] && [ $multigpu_rc -eq 0 ] && [ $bench_rc -eq 0 ] && [ $bench_dp_rc -eq 0 ] &&
  [ $bench_tp_rc -eq 0 ]
