#pragma once
// How this process was started, and MPI's lifetime.
//
// `mpirun -np N megatron ...` (Open MPI), `srun megatron ...` (Slurm) or any PMIx launcher
// tells each process its rank through the environment. A process started without a launcher
// is a world of one and never touches MPI, so single-process runs need no MPI installation at
// run time. The GPU of a process is its local rank (DESIGN.md §7).
#include <functional>
#include <string>

namespace megatron {

enum class Launcher { none, open_mpi, slurm, pmix };
const char* launcher_name(Launcher launcher);

struct ProcessInfo {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;   // 0 when the launcher does not say (PMIx): MPI tells
  int local_rank = -1;  // rank among the processes of this node; -1 until known (PMIx: from MPI)
  bool launched() const { return launcher != Launcher::none; }
};

// Reads the launcher's variables through `getenv` (injected for tests). Precedence, innermost
// launcher first:
//   torchrun and other PyTorch launchers (RANK, WORLD_SIZE): their ranks meet through a TCP store
//     that MPI cannot join, so more than one rank is refused;
//   Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK);
//   Slurm job steps (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID; a batch script without srun
//     is not a launch): joined through PMIx (srun --mpi=pmix sets PMIX_RANK); a step of several
//     tasks without it (srun without --mpi=pmix, or with --mpi=pmi2) is refused;
//   MPICH-family launchers (MPICH's and Intel MPI's mpiexec.hydra, MVAPICH: PMI_RANK, PMI_SIZE):
//     their PMI cannot be joined by the Open MPI this build links, so more than one rank is refused;
//   PMIx alone (PMIX_RANK: prterun, Open MPI 5).
// A refused launcher ends the process at once with an error naming it and the command that works,
// rather than letting N processes train N separate models into one --save directory; one rank
// under any launcher is a world of one. Malformed or inconsistent values throw naming the variable.
using EnvLookup = std::function<const char*(const char*)>;
ProcessInfo process_info_from_env(const EnvLookup& getenv);
ProcessInfo process_info_from_env();  // this process's environment

// Initialises MPI for a launched process (MPI_THREAD_MULTIPLE: the watchdog answers other
// ranks from its own thread), makes MPI errors return codes instead of aborting, and checks
// MPI agrees with the launcher's rank and size. The destructor finalises MPI; when it runs
// during stack unwinding (an error escaped), it aborts the job instead, because other ranks may
// wait in a collective this rank will never join, and MPI_Finalize could hang with them.
class MpiRuntime {
 public:
  explicit MpiRuntime(const ProcessInfo& from_env);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  // The launcher's view completed by MPI (world size, local rank).
  const ProcessInfo& process() const { return process_; }
  // Ends every rank of the job with `code` (MPI_Abort); for errors after which this rank cannot
  // take part in collectives any more.
  [[noreturn]] void abort(int code) const;
  // The MPI library's own description (MPI_Get_library_version), its first line.
  static std::string library_version();

 private:
  ProcessInfo process_;
};

}  // namespace megatron
