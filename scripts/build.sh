#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release); further arguments go to
# `cmake --build` (e.g. --target megatron). The CUDA backend is compiled whenever nvcc is found
# (/usr/local/cuda on the project's machines).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
shift || true
[ -f "build/$preset/build.ninja" ] || cmake --preset "$preset" >/dev/null
cmake --build "build/$preset" -j "$(nproc)" "$@"
