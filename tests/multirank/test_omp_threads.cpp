// multirank-np: 2 4
// Each rank's OpenMP thread count under mpirun: the ranks of this node exchange their affinity
// masks, and each rank runs max(1, CPUs in its mask / ranks whose masks overlap it) threads. The
// expected counts are worked out here from sched_getaffinity and cpu_set_t alone: first as mpirun
// bound the ranks (to a core each at -np 2, unbound when oversubscribed), then with every rank
// widened to the union of the masks, so all ranks share every CPU.
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <vector>

#include "megatron/parallel/cpu_threads.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

int threads_in_a_parallel_region() {
  int n = 0;
#pragma omp parallel
  {
#pragma omp single
    n = omp_get_num_threads();
  }
  return n;
}

std::vector<cpu_set_t> every_rank_mask() {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  EXPECT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<cpu_set_t> all(static_cast<size_t>(size));
  MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
  return all;
}

// The expected count from the masks of every rank (one node here), and the configured one when
// OpenMP starts from one thread per CPU of the mask (its own default without OMP_NUM_THREADS).
void expect_share_of_the_node() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::vector<cpu_set_t> masks = every_rank_mask();
  int sharing = 0;
  for (const cpu_set_t& other : masks) {
    cpu_set_t both;
    CPU_AND(&both, &masks[size_t(rank)], &other);
    sharing += CPU_COUNT(&both) > 0 ? 1 : 0;
  }
  const int cpus = CPU_COUNT(&masks[size_t(rank)]);
  const int expected = std::max(1, cpus / sharing);

  omp_set_num_threads(cpus);
  const auto no_env = [](const char*) -> const char* { return nullptr; };
  const CpuThreads t = configure_cpu_threads(mpi_runtime().get(), no_env);
  EXPECT_EQ(t.sharing_ranks, sharing);
  EXPECT_EQ(t.threads, expected);
  EXPECT_EQ(threads_in_a_parallel_region(), expected);
}

TEST(OmpThreads, EachRankRunsItsShareOfTheNode) {
  expect_share_of_the_node();  // as mpirun placed the ranks

  const std::vector<cpu_set_t> masks = every_rank_mask();
  cpu_set_t all;
  CPU_ZERO(&all);
  for (const cpu_set_t& m : masks) CPU_OR(&all, &all, &m);
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  expect_share_of_the_node();  // every rank sees every CPU: the CPUs divided by the world
  EXPECT_EQ(omp_get_max_threads(), std::max(1, CPU_COUNT(&all) / size));
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
}

TEST(OmpThreads, OmpNumThreadsStands) {
  omp_set_num_threads(3);  // as the runtime set it from OMP_NUM_THREADS=3
  const auto env = [](const char* name) -> const char* {
    return std::string(name) == "OMP_NUM_THREADS" ? "3" : nullptr;
  };
  EXPECT_TRUE(configure_cpu_threads(mpi_runtime().get(), env).from_environment);
  EXPECT_EQ(threads_in_a_parallel_region(), 3);
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
