#pragma once
// How many OpenMP threads each rank's CPU work uses.
//
// OpenMP starts as many threads as the process's CPU affinity mask holds CPUs. Ranks that mpirun
// leaves unbound (--oversubscribe, --bind-to none) each see every core of the node, so N ranks run
// N x cores threads that preempt each other in every parallel loop (two ranks on two cores trained a
// tiny model 10x slower than with one thread each). The default instead divides the CPUs of this
// rank's mask among the ranks of its node whose masks overlap it: unbound ranks split the node,
// a rank bound to its own cores (mpirun's --bind-to core) keeps them all, ranks bound to a socket
// split the socket. The OpenMP standard's OMP_NUM_THREADS overrides the default, as it does for any
// OpenMP program; there is no flag of our own (Megatron has none either).
#include <cstdint>
#include <vector>

#include "megatron/parallel/launch.h"

namespace megatron {

// One process's CPU affinity: bit c % 64 of word c / 64 is set when it may run on CPU c.
using CpuMask = std::vector<uint64_t>;

int count_cpus(const CpuMask& mask);
// How many of node_masks (the masks of this node's ranks) overlap node_masks[self], itself included.
int ranks_sharing_cpus(const std::vector<CpuMask>& node_masks, size_t self);

struct CpuThreads {
  int threads = 1;
  int cpus = 1;                   // CPUs in this rank's affinity mask
  int sharing_ranks = 1;          // ranks of this node whose masks overlap it, itself included
  bool from_environment = false;  // OMP_NUM_THREADS is set: the OpenMP runtime applied it already
};

// The choice for a rank with `cpus` CPUs in its mask that `sharing_ranks` ranks share:
// OMP_NUM_THREADS's first value when set (omp_num_threads: its text, null when unset; a malformed
// value throws naming it), else max(1, cpus / sharing_ranks).
CpuThreads cpu_threads_per_rank(int cpus, int sharing_ranks, const char* omp_num_threads);

// This process's affinity mask (sched_getaffinity); every CPU when the mask cannot be read.
CpuMask process_cpu_mask();

// Chooses for this process and applies the choice with omp_set_num_threads, which sets it for the
// calling thread: call it from the thread that runs the ops. With `mpi` (null for one process) the
// ranks of each node exchange their masks, so every rank of the job must call it. Logs the choice.
CpuThreads configure_cpu_threads(const MpiRuntime* mpi, const EnvLookup& getenv);
CpuThreads configure_cpu_threads(const MpiRuntime* mpi);  // this process's environment

}  // namespace megatron
