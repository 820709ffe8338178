# Sourced by the multi-rank test scripts: rank_process JOB RANK prints the pid of the process of
# world rank RANK among the descendants of JOB (an mpirun), found by the rank Open MPI put in its
# environment; nothing when there is none (yet).
descendants() {
  local child
  for child in $(ps -o pid= --ppid "$1"); do
    echo "$child"
    descendants "$child"
  done
}
rank_process() {
  local pid
  for pid in $(descendants "$1"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
      return
    fi
  done
}
