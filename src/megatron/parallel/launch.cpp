#include "megatron/parallel/launch.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "megatron/core/error.h"
#include "megatron/parallel/mpi_check.h"

namespace megatron {

namespace {

// The integer in variable `name`, or `fallback` when it is unset.
int env_int(const EnvLookup& getenv, const char* name, int fallback) {
  const char* text = getenv(name);
  if (text == nullptr) return fallback;
  const std::string s(text);
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  MEGATRON_CHECK(ec == std::errc() && end == s.data() + s.size() && value >= 0 && !s.empty(),
                 "environment variable " << name << "='" << s << "' is not a non-negative integer; the launcher set "
                                         << "it wrongly or it leaked from another job: unset it");
  return value;
}

ProcessInfo checked(ProcessInfo p, const char* rank_var, const char* size_var) {
  MEGATRON_CHECK(p.world_size == 0 || p.rank < p.world_size,
                 launcher_name(p.launcher) << " says rank " << p.rank << " (" << rank_var << ") of " << p.world_size
                                           << " processes (" << size_var << "); the rank must be below the size");
  return p;
}

// The launches whose processes MPI joins into one job, for the errors of those it cannot join.
std::string working_launches(int world_size) {
  const std::string n = world_size > 0 ? std::to_string(world_size) : "N";
  return "Launch with Open MPI's `mpirun -np " + n + " megatron <subcommand> <flags>`, or in a Slurm allocation " +
         "`srun --mpi=pmix -n " + n + " megatron <subcommand> <flags>`";
}

// A launcher MPI cannot join has started `world_size` processes (0: unknown): one process is a
// world of one; more would each train alone and overwrite each other's checkpoints.
ProcessInfo alone_or_refused(const std::string& launcher, const std::string& why, int rank, int world_size,
                             const char* variables) {
  if (world_size == 1) return ProcessInfo{};
  MEGATRON_FAIL(launcher << " started this process as rank " << rank << " of "
                         << (world_size > 0 ? std::to_string(world_size) : std::string("several")) << " (" << variables
                         << "), but " << why
                         << ": each process would train a separate model and overwrite the others' checkpoints. "
                         << working_launches(world_size));
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::none:
      return "no launcher";
    case Launcher::open_mpi:
      return "Open MPI";
    case Launcher::slurm:
      return "Slurm";
    case Launcher::pmix:
      return "PMIx";
  }
  return "?";
}

ProcessInfo process_info_from_env(const EnvLookup& getenv) {
  ProcessInfo p;
  if (getenv("RANK") != nullptr && getenv("WORLD_SIZE") != nullptr) {
    const int rank = env_int(getenv, "RANK", 0), size = env_int(getenv, "WORLD_SIZE", 0);
    MEGATRON_CHECK(rank < size, "RANK=" << rank << " and WORLD_SIZE=" << size
                                        << " (a PyTorch launcher's variables) are inconsistent: the rank must be "
                                           "below the size; unset them, they leaked from another job");
    // torchrun's elastic agent sets TORCHELASTIC_RUN_ID; torch.distributed.launch, DeepSpeed and
    // Accelerate set RANK and WORLD_SIZE too.
    const std::string name = getenv("TORCHELASTIC_RUN_ID") != nullptr
                                 ? "torchrun"
                                 : "a PyTorch launcher (RANK and WORLD_SIZE are set, as torchrun, "
                                   "torch.distributed.launch and DeepSpeed set them)";
    return alone_or_refused(name,
                            "its ranks meet through PyTorch's TCP store (MASTER_ADDR:MASTER_PORT), which "
                            "megatron-cpp's MPI ranks cannot join",
                            rank, size, "RANK, WORLD_SIZE");
  }
  if (getenv("OMPI_COMM_WORLD_RANK") != nullptr) {
    p.launcher = Launcher::open_mpi;
    p.rank = env_int(getenv, "OMPI_COMM_WORLD_RANK", 0);
    p.world_size = env_int(getenv, "OMPI_COMM_WORLD_SIZE", 0);
    p.local_rank = env_int(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", -1);
    MEGATRON_CHECK(p.world_size > 0, "Open MPI set OMPI_COMM_WORLD_RANK but not a positive OMPI_COMM_WORLD_SIZE");
    return checked(p, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  }
  const bool pmix = getenv("PMIX_RANK") != nullptr;
  // PMI-1/PMI-2 without PMIx: an MPICH-family mpiexec (Hydra), or srun --mpi=pmi2, whose ranks
  // and size then equal Slurm's. Open MPI (4 without --with-pmi, 5 at all) speaks PMIx only.
  if (getenv("PMI_RANK") != nullptr && !pmix) {
    const int rank = env_int(getenv, "PMI_RANK", 0), size = env_int(getenv, "PMI_SIZE", 0);
    const char* slurm_rank = getenv("SLURM_PROCID");
    const char* slurm_size = getenv("SLURM_STEP_NUM_TASKS");
    const bool srun = slurm_rank != nullptr && slurm_size != nullptr && env_int(getenv, "SLURM_PROCID", 0) == rank &&
                      env_int(getenv, "SLURM_STEP_NUM_TASKS", 0) == size;
    const std::string name = srun                              ? "srun --mpi=pmi2"
                             : getenv("I_MPI_ROOT") != nullptr ? "Intel MPI's mpirun (mpiexec.hydra)"
                                                               : "an MPICH-family launcher (MPICH's or MVAPICH's "
                                                                 "mpiexec/mpirun, Hydra)";
    return alone_or_refused(name,
                            "this megatron is built with Open MPI, which joins jobs through PMIx only and "
                            "cannot join a PMI-1/PMI-2 job",
                            rank, size, "PMI_RANK, PMI_SIZE");
  }
  // srun sets SLURM_STEP_NUM_TASKS for the tasks of a step; a batch script has SLURM_PROCID=0 and
  // SLURM_NTASKS=N without being one of N processes, so SLURM_NTASKS alone is no launch.
  if (getenv("SLURM_PROCID") != nullptr && getenv("SLURM_STEP_NUM_TASKS") != nullptr) {
    p.launcher = Launcher::slurm;
    p.rank = env_int(getenv, "SLURM_PROCID", 0);
    p.world_size = env_int(getenv, "SLURM_STEP_NUM_TASKS", 0);
    p.local_rank = env_int(getenv, "SLURM_LOCALID", -1);
    MEGATRON_CHECK(p.world_size > 0, "Slurm set SLURM_STEP_NUM_TASKS=0; the step has no tasks");
    checked(p, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS");
    // srun --mpi=pmix (or MpiDefault=pmix) starts a PMIx server that MPI_Init joins. Without it,
    // Open MPI's MPI_Init aborts with a message about how Open MPI was built, or (with only some
    // of Slurm's variables) gives each task a world of one.
    if (pmix) return p;
    return alone_or_refused("srun",
                            "no PMIx server runs for its tasks (PMIX_RANK is unset: srun ran without "
                            "--mpi=pmix and the cluster's MpiDefault is not pmix; `srun --mpi=list` shows the "
                            "plugins), so MPI cannot join them into one job",
                            p.rank, p.world_size, "SLURM_PROCID, SLURM_STEP_NUM_TASKS");
  }
  if (pmix) {
    p.launcher = Launcher::pmix;
    p.rank = env_int(getenv, "PMIX_RANK", 0);
    p.world_size = 0;  // PMIx publishes the size through its API only; MPI reports it
    return p;
  }
  return p;
}

ProcessInfo process_info_from_env() {
  return process_info_from_env([](const char* name) -> const char* { return std::getenv(name); });
}

int mpi_world_rank() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void mpi_fail(const char* call, int code, const std::string& group, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) std::snprintf(text, sizeof text, "MPI error %d", code);
  throw_error(file, line,
              std::string(call) + " failed on world rank " + std::to_string(mpi_world_rank()) + " in group " + group +
                  ": " + text);
}

MpiRuntime::MpiRuntime(const ProcessInfo& from_env) : process_(from_env) {
  MEGATRON_CHECK(from_env.launched(), "MPI is only started for a process launched by mpirun or srun");
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized), "world");
  MEGATRON_CHECK(!initialized, "MPI is already initialised in this process; create one MpiRuntime and share it");
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "world");
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "world");
  MEGATRON_CHECK(provided == MPI_THREAD_MULTIPLE, "this MPI library provides thread level "
                                                      << provided << ", but the watchdog needs MPI_THREAD_MULTIPLE ("
                                                      << MPI_THREAD_MULTIPLE
                                                      << "); use an MPI built with thread support (Open MPI is)");
  int rank = 0, size = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "world");
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size), "world");
  MEGATRON_CHECK(rank == from_env.rank && (from_env.world_size == 0 || size == from_env.world_size),
                 launcher_name(from_env.launcher)
                     << " started this process as rank " << from_env.rank << " of " << from_env.world_size
                     << " but MPI sees rank " << rank << " of " << size
                     << ": this MPI library cannot talk to the launcher (with srun, pass --mpi=pmix and use an MPI "
                        "built with PMIx)");
  process_.world_size = size;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "node");
  int node_rank = 0;
  MPI_CHECK(MPI_Comm_rank(node, &node_rank), "node");
  MPI_CHECK(MPI_Comm_free(&node), "node");
  if (process_.local_rank < 0) process_.local_rank = node_rank;
}

MpiRuntime::~MpiRuntime() {
  if (std::uncaught_exceptions() > 0) {
    std::fprintf(stderr, "[rank %d] an error is ending this rank; aborting the job so no other rank waits for it\n",
                 process_.rank);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
}

void MpiRuntime::abort(int code) const {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this satisfies [[noreturn]]
}

std::string MpiRuntime::library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_CHECK(MPI_Get_library_version(text, &length), "world");
  const std::string all(text, size_t(length));
  return all.substr(0, all.find_first_of("\r\n,"));
}

}  // namespace megatron
