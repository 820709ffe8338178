#!/usr/bin/env bash
# Rules of the library's source (src/megatron) that a grep can check; each failure names the file,
# the line and the rule. Usage: source_rules_test.sh <repository root>
#  1. Library code never writes the process environment (setenv, putenv, unsetenv, clearenv):
#     defaults for CUDA and NCCL are the program's policy (tools/megatron/library_environment.h)
#     and the test harness's; the library may read the environment and refuse what it cannot use.
#  2. Only ops/ (which backend runs an op) and parallel/ (which communicator a group gets) test
#     MEGATRON_WITH_CUDA: everything else, training/ included, calls the CUDA runtime's
#     every-build API (cuda_runtime/device.h, pinned_memory.h, event_timer.h, copy_stream.h), which answers "no
#     GPU" in a build without CUDA.
set -uo pipefail
src="${1:?usage: $0 <repository root>}/src/megatron"
[ -d "$src" ] || { echo "no $src" >&2; exit 2; }
failed=0
report() {  # <rule> <grep output>
  [ -z "$2" ] && return
  echo "$1:" >&2
  echo "$2" | sed 's/^/  /' >&2
  failed=1
}
report "library code writes the environment (rule 1; set defaults in tools/megatron or the tests instead)" \
  "$(grep -rnE --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' \
       '(^|[^A-Za-z0-9_])(setenv|putenv|unsetenv|clearenv)[[:space:]]*\(' "$src")"
report "a CUDA #ifdef outside ops/ and parallel/ (rule 2; call the cuda_runtime API that exists in every build)" \
  "$(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' MEGATRON_WITH_CUDA "$src" |
       grep -vE "^$src/(ops|parallel)/")"
[ "$failed" = 0 ] && echo "source rules hold in $src"
exit "$failed"
