// Reading the launcher's environment (fake environments; no launcher needed).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "megatron/parallel/launch.h"
#include "test_util.h"

using namespace megatron;

namespace {

ProcessInfo parse(const std::map<std::string, std::string>& env) {
  return process_info_from_env([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST(Launch, NoLauncherIsAWorldOfOne) {
  const ProcessInfo p = parse({{"HOME", "/root"}});
  EXPECT_FALSE(p.launched());
  EXPECT_EQ(p.rank, 0);
  EXPECT_EQ(p.world_size, 1);
}

TEST(Launch, OpenMpi) {
  const ProcessInfo p = parse({{"OMPI_COMM_WORLD_RANK", "5"},
                               {"OMPI_COMM_WORLD_SIZE", "8"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                               {"SLURM_PROCID", "0"},
                               {"SLURM_STEP_NUM_TASKS", "2"}});
  EXPECT_EQ(p.launcher, Launcher::open_mpi) << "mpirun inside a Slurm step: Open MPI's variables win";
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.world_size, 8);
  EXPECT_EQ(p.local_rank, 1);
}

TEST(Launch, SlurmStepButNotBatchScript) {
  const ProcessInfo p = parse({{"SLURM_PROCID", "3"},
                               {"SLURM_STEP_NUM_TASKS", "4"},
                               {"SLURM_LOCALID", "3"},
                               {"SLURM_NTASKS", "16"},
                               {"PMIX_RANK", "3"}});
  EXPECT_EQ(p.launcher, Launcher::slurm);
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.world_size, 4) << "the step's tasks, not the allocation's";
  EXPECT_EQ(p.local_rank, 3);
  EXPECT_FALSE(parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}}).launched())
      << "a batch script sees SLURM_PROCID=0 of SLURM_NTASKS without being a task of a step";
}

TEST(Launch, PmixLeavesSizeAndLocalRankToMpi) {
  const ProcessInfo p = parse({{"PMIX_RANK", "2"}});
  EXPECT_EQ(p.launcher, Launcher::pmix);
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 0);
  EXPECT_EQ(p.local_rank, -1);
}

TEST(Launch, MalformedValuesNameTheVariable) {
  EXPECT_NE(megatron::testing::error_of([] {
              parse({{"OMPI_COMM_WORLD_RANK", "1x"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
            }).find("OMPI_COMM_WORLD_RANK='1x' is not a non-negative integer"),
            std::string::npos);
  EXPECT_NE(megatron::testing::error_of([] {
              parse({{"SLURM_PROCID", "-1"}, {"SLURM_STEP_NUM_TASKS", "2"}});
            }).find("SLURM_PROCID"),
            std::string::npos);
  EXPECT_NE(megatron::testing::error_of([] {
              parse({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
            }).find("rank must be below the size"),
            std::string::npos);
  EXPECT_NE(megatron::testing::error_of([] {
              parse({{"OMPI_COMM_WORLD_RANK", "0"}});
            }).find("OMPI_COMM_WORLD_SIZE"),
            std::string::npos);
}

// Each launcher below sets what it really sets; a launcher MPI cannot join must stop the process
// before it trains alone, naming the launcher and a launch that works, while one rank under it is
// a world of one.
namespace {
std::map<std::string, std::string> torchrun_env(const std::string& rank, const std::string& size) {
  return {{"RANK", rank},
          {"WORLD_SIZE", size},
          {"LOCAL_RANK", rank},
          {"LOCAL_WORLD_SIZE", size},
          {"GROUP_RANK", "0"},
          {"ROLE_RANK", rank},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_RUN_ID", "none"},
          {"TORCHELASTIC_RESTART_COUNT", "0"},
          {"TORCHELASTIC_MAX_RESTARTS", "0"},
          {"OMP_NUM_THREADS", "1"}};
}

// srun -n <size> inside an allocation, without an MPI plugin.
std::map<std::string, std::string> srun_env(const std::string& rank, const std::string& size) {
  return {{"SLURM_JOB_ID", "4242"},       {"SLURM_JOBID", "4242"},       {"SLURM_STEP_ID", "0"},
          {"SLURM_STEPID", "0"},          {"SLURM_PROCID", rank},        {"SLURM_LOCALID", rank},
          {"SLURM_NODEID", "0"},          {"SLURM_NTASKS", size},        {"SLURM_STEP_NUM_TASKS", size},
          {"SLURM_STEP_NUM_NODES", "1"},  {"SLURM_STEP_NODELIST", "n1"}, {"SLURM_STEP_TASKS_PER_NODE", size},
          {"SLURM_TASKS_PER_NODE", size}, {"SLURM_CPUS_ON_NODE", "16"},  {"SLURM_NODELIST", "n1"}};
}

// MPICH's mpiexec.hydra -n <size> (PMI-1 over a file descriptor).
std::map<std::string, std::string> hydra_env(const std::string& rank, const std::string& size) {
  return {{"PMI_RANK", rank},        {"PMI_SIZE", size},      {"PMI_FD", "6"},      {"MPI_LOCALRANKID", rank},
          {"MPI_LOCALNRANKS", size}, {"PMI_SUBVERSION", "1"}, {"PMI_VERSION", "1"}, {"HYDI_CONTROL_FD", "7"}};
}

std::map<std::string, std::string> with(std::map<std::string, std::string> env,
                                        const std::map<std::string, std::string>& more) {
  for (const auto& [k, v] : more) env[k] = v;
  return env;
}

void expect_refused(const std::map<std::string, std::string>& env, const std::string& launcher,
                    const std::string& size) {
  const std::string message = megatron::testing::error_of([&] { parse(env); });
  EXPECT_EQ(message.rfind(launcher, 0), 0u) << message;
  EXPECT_NE(message.find(" started this process as rank"), std::string::npos) << message;
  EXPECT_NE(message.find("each process would train a separate model"), std::string::npos) << message;
  EXPECT_NE(message.find("`mpirun -np " + size + " megatron"), std::string::npos) << message;
  EXPECT_NE(message.find("`srun --mpi=pmix -n " + size + " megatron"), std::string::npos) << message;
}
}  // namespace

TEST(Launch, TorchrunIsRefusedNamingTheWorkingCommand) {
  expect_refused(torchrun_env("1", "4"), "torchrun", "4");
  // torchrun inside a Slurm step (srun torchrun ...): torchrun is the launcher of this process.
  expect_refused(with(torchrun_env("3", "8"), srun_env("0", "2")), "torchrun", "8");
  // Without the elastic agent's variables: another PyTorch launcher.
  std::map<std::string, std::string> legacy = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}};
  expect_refused(legacy, "a PyTorch launcher", "2");
}

TEST(Launch, OneRankUnderTorchrunIsAWorldOfOne) {
  const ProcessInfo p = parse(torchrun_env("0", "1"));
  EXPECT_FALSE(p.launched());
  EXPECT_EQ(p.world_size, 1);
  EXPECT_NE(megatron::testing::error_of([] {
              parse({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
            }).find("the rank must be below the size"),
            std::string::npos);
}

// What Open MPI's MPI_Init does here (checked by hand with Open MPI 4.1): with all of srun's
// variables it aborts, blaming how Open MPI was built; with fewer, every task is rank 0 of 1.
TEST(Launch, SrunWithoutPmixIsRefused) {
  expect_refused(srun_env("1", "2"), "srun", "2");
  // srun --mpi=pmi2: PMI-2 variables agreeing with Slurm's.
  expect_refused(with(srun_env("1", "2"), {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"PMI_FD", "5"}}), "srun --mpi=pmi2",
                 "2");
  const ProcessInfo one = parse(srun_env("0", "1"));
  EXPECT_FALSE(one.launched()) << "a one-task step without MPI is a world of one";
}

TEST(Launch, SrunWithPmixJoins) {
  const ProcessInfo p = parse(with(srun_env("1", "2"), {{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "slurm.pmix.4242.0"}}));
  EXPECT_EQ(p.launcher, Launcher::slurm);
  EXPECT_EQ(p.rank, 1);
  EXPECT_EQ(p.world_size, 2);
  EXPECT_EQ(p.local_rank, 1);
}

TEST(Launch, MpichAndIntelMpiAreRefused) {
  expect_refused(hydra_env("1", "2"), "an MPICH-family launcher", "2");
  expect_refused(with(hydra_env("0", "4"), {{"I_MPI_ROOT", "/opt/intel/oneapi/mpi/2021.10.0"}}), "Intel MPI's mpirun",
                 "4");
  // Hydra inside a Slurm allocation starts its proxies with srun: Slurm's variables describe the
  // proxies' step (one task per node), not the ranks.
  expect_refused(with(hydra_env("5", "8"), srun_env("1", "2")), "an MPICH-family launcher", "8");
  EXPECT_FALSE(parse(hydra_env("0", "1")).launched());
}
