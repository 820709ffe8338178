#!/usr/bin/env bash
# On a GPU machine: configure and build the `gpu` preset (CUDA required, sm_90), run the tests
# labelled gpu, optionally the training benchmark against PyTorch (--bench [preset:mbs ...]),
# and print a summary table last. Logs go to $OUT (the device tool brings them back) or
# /tmp/gpu-check.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"  # never NVLink multicast on shared machines
out="${OUT:-/tmp/gpu-check}"
mkdir -p "$out"
bench=0
[ "${1:-}" = "--bench" ] && { bench=1; shift; }
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

(cd build/gpu && ctest -L gpu --output-on-failure --timeout 600) > "$out/gpu-tests.log" 2>&1
gpu_rc=$?
[ $gpu_rc -eq 0 ] || grep -E "Failure|FAILED|Expected|Which is|error" "$out/gpu-tests.log" | head -60

bench_rc=0
if [ $bench -eq 1 ] && [ $build_rc -eq 0 ]; then
  OUT="$out" bench/bench_training.sh build/gpu "$@" > "$out/bench.txt" 2>&1
  bench_rc=$?
fi

echo
echo "| step | result | detail |"
echo "|---|---|---|"
echo "| build (gpu preset) | $(status $build_rc) | ${build_s}s |"
echo "| ctest -L gpu | $(status $gpu_rc) | $(grep -Eo '[0-9]+% tests passed.*' "$out/gpu-tests.log" | head -1) |"
if [ $bench -eq 1 ]; then
  echo "| bench | $(status $bench_rc) | $out/bench.txt |"
  echo
  cat "$out/bench.txt"
fi
[ $build_rc -eq 0 ] && [ $gpu_rc -eq 0 ] && [ $bench_rc -eq 0 ]
