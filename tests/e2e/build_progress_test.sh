#!/usr/bin/env bash
# scripts/build-progress.sh (what scripts/demo.sh shows while it builds), fed ninja's output as a
# log sees it: the 300 status lines become a line per tenth of the build, the last at 100%, while
# compiler messages and ninja's own lines pass through unchanged and in order.
# usage: build_progress_test.sh SCRIPTS_DIR
set -u
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
ninja_output() {
  echo "[0/2] Re-checking globbed directories..."
  echo "[1/2] Re-running CMake..."
  echo "-- Build files have been written to: build/release"
  for i in $(seq 1 300); do
    echo "[$i/300] Building CXX object src/megatron/CMakeFiles/file_$i.cpp.o"
    [ "$i" = 123 ] && printf '%s\n' "src/file_123.cpp:7:3: warning: unused variable 'x'" "    7 |   int x;"
  done
  echo "ninja: build stopped: subcommand failed."
}
out=$(ninja_output | "$1/build-progress.sh" "building megatron") || fail "the filter failed"
expected="building megatron: 0/2 steps (0%)
building megatron: 1/2 steps (50%)
-- Build files have been written to: build/release
building megatron: 1/300 steps (0%)
building megatron: 30/300 steps (10%)
building megatron: 60/300 steps (20%)
building megatron: 90/300 steps (30%)
building megatron: 120/300 steps (40%)
src/file_123.cpp:7:3: warning: unused variable 'x'
    7 |   int x;
building megatron: 150/300 steps (50%)
building megatron: 180/300 steps (60%)
building megatron: 210/300 steps (70%)
building megatron: 240/300 steps (80%)
building megatron: 270/300 steps (90%)
building megatron: 300/300 steps (100%)
ninja: build stopped: subcommand failed."
[ "$out" = "$expected" ] || {
  diff <(echo "$expected") <(echo "$out")
  fail "the progress differs from the expected lines"
}
echo "PASS: 304 status lines shown as $(grep -c '^building' <<<"$out"), messages kept"
