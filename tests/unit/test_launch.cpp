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
  const ProcessInfo p =
      parse({{"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "3"}, {"SLURM_NTASKS", "16"}});
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
