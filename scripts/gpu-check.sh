#!/usr/bin/env bash
# On a GPU machine: configure and build the `gpu` preset (CUDA required, sm_90), run the tests
# labelled gpu, then the CPU tests as a sanity check of the same build, and print a summary
# table last. Benchmarks join this script with the CUDA backend.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"  # never NVLink multicast on shared machines
out="${OUT:-/tmp/gpu-check}"
mkdir -p "$out"
status() { [ "$1" -eq 0 ] && echo pass || echo "FAIL ($1)"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
start=$(date +%s)
cmake --preset gpu > "$out/configure.log" 2>&1 && cmake --build build/gpu -j "$(nproc)" > "$out/build.log" 2>&1
build_rc=$?
build_s=$(( $(date +%s) - start ))
[ $build_rc -eq 0 ] || tail -30 "$out/build.log"

(cd build/gpu && ctest -L gpu --output-on-failure --timeout 600) > "$out/gpu-tests.log" 2>&1
gpu_rc=$?
(cd build/gpu && ctest -L 'unit|e2e' -j 8 --timeout 600) > "$out/cpu-tests.log" 2>&1
cpu_rc=$?
[ $gpu_rc -eq 0 ] || tail -40 "$out/gpu-tests.log"
[ $cpu_rc -eq 0 ] || grep -E "Failed|\*\*\*" "$out/cpu-tests.log" | head -20

echo
echo "| step | result | detail |"
echo "|---|---|---|"
echo "| build (gpu preset) | $(status $build_rc) | ${build_s}s |"
echo "| ctest -L gpu | $(status $gpu_rc) | $(grep -Eo '[0-9]+% tests passed.*' "$out/gpu-tests.log" | head -1) |"
echo "| ctest -L unit\|e2e | $(status $cpu_rc) | $(grep -Eo '[0-9]+% tests passed.*' "$out/cpu-tests.log" | head -1) |"
[ $build_rc -eq 0 ] && [ $gpu_rc -eq 0 ] && [ $cpu_rc -eq 0 ]
