#!/usr/bin/env bash
# Shows a build's progress without its command lines: reads ninja's output (cmake --build) on stdin
# and turns its "[done/total]" status lines into one line that updates in place on a terminal, or
# a line per tenth of the build in a log. Everything else (compiler warnings and errors, ninja's
# messages) passes through unchanged.
#   usage: cmake --build DIR ... 2>&1 | scripts/build-progress.sh [LABEL]
label=${1:-build}
tty=0
[ -t 1 ] && tty=1
exec awk -v label="$label" -v tty="$tty" '
  function show(line) {
    if (tty) { printf "\r\033[K%s", line; pending = 1 } else print line
    fflush()
  }
  match($0, /^\[[0-9]+\/[0-9]+\] /) {
    split(substr($0, 2, RLENGTH - 3), count, "/")
    done = count[1] + 0; total = count[2] + 0
    percent = total > 0 ? int(100 * done / total) : 100
    if (total != last_total) { next_percent = 0; last_total = total }  # ninja restarted (CMake re-ran)
    if (tty || percent >= next_percent || done == total) {
      show(sprintf("%s: %d/%d steps (%d%%)", label, done, total, percent))
      while (next_percent <= percent) next_percent += 10
    }
    next
  }
  {
    if (pending) { printf "\n"; pending = 0 }
    print; fflush()
  }
  END { if (pending) printf "\n" }'
