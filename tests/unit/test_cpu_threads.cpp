// The OpenMP thread count of a rank: the CPUs of its affinity mask divided among the ranks of its
// node that share them, or OMP_NUM_THREADS. Masks and counts below are made up; the expected
// thread counts are worked out by hand.
#include <gtest/gtest.h>

#include "megatron/parallel/cpu_threads.h"
#include "test_util.h"

using namespace megatron;

namespace {
// A mask of CPUs [first, first + n) on a 128-CPU node.
CpuMask cpus(int first, int n) {
  CpuMask m(2, 0);
  for (int c = first; c < first + n; ++c) m[size_t(c / 64)] |= uint64_t(1) << (c % 64);
  return m;
}
}  // namespace

TEST(CpuThreads, DividesTheMaskAmongTheRanksSharingIt) {
  EXPECT_EQ(cpu_threads_per_rank(2, 2, nullptr).threads, 1) << "two unbound ranks on two cores: one thread each";
  EXPECT_EQ(cpu_threads_per_rank(128, 8, nullptr).threads, 16);
  EXPECT_EQ(cpu_threads_per_rank(16, 3, nullptr).threads, 5) << "rounded down: never more threads than cores";
  EXPECT_EQ(cpu_threads_per_rank(2, 4, nullptr).threads, 1) << "at least one thread when ranks outnumber cores";
  EXPECT_EQ(cpu_threads_per_rank(1, 1, nullptr).threads, 1);
  EXPECT_FALSE(cpu_threads_per_rank(128, 8, nullptr).from_environment);
}

TEST(CpuThreads, OmpNumThreadsOverrides) {
  const CpuThreads t = cpu_threads_per_rank(128, 8, "3");
  EXPECT_EQ(t.threads, 3);
  EXPECT_TRUE(t.from_environment);
  EXPECT_EQ(cpu_threads_per_rank(2, 2, "6").threads, 6) << "the user's choice stands, even oversubscribed";
  EXPECT_EQ(cpu_threads_per_rank(2, 2, "4,2").threads, 4) << "nested levels: the first is the ranks' own";
  for (const char* bad : {"", "0", "-2", "four", "2x"}) {
    const std::string message = megatron::testing::error_of([&] { cpu_threads_per_rank(8, 1, bad); });
    EXPECT_NE(message.find("OMP_NUM_THREADS='" + std::string(bad) + "'"), std::string::npos) << message;
  }
}

TEST(CpuThreads, RanksSharingAMask) {
  // Unbound: every rank sees the node's 128 CPUs.
  const std::vector<CpuMask> unbound(8, cpus(0, 128));
  EXPECT_EQ(ranks_sharing_cpus(unbound, 5), 8);
  EXPECT_EQ(cpu_threads_per_rank(count_cpus(unbound[5]), ranks_sharing_cpus(unbound, 5), nullptr).threads, 16);
  // Bound to their own 16 cores (mpirun --bind-to core with 16 PEs): each keeps its 16.
  std::vector<CpuMask> bound;
  for (int r = 0; r < 8; ++r) bound.push_back(cpus(16 * r, 16));
  EXPECT_EQ(ranks_sharing_cpus(bound, 3), 1);
  EXPECT_EQ(cpu_threads_per_rank(count_cpus(bound[3]), ranks_sharing_cpus(bound, 3), nullptr).threads, 16);
  // Bound to one of two 64-core sockets, four ranks each (mpirun's default above two ranks): 64 / 4.
  std::vector<CpuMask> sockets;
  for (int r = 0; r < 8; ++r) sockets.push_back(cpus(r < 4 ? 0 : 64, 64));
  EXPECT_EQ(ranks_sharing_cpus(sockets, 6), 4);
  EXPECT_EQ(cpu_threads_per_rank(count_cpus(sockets[6]), ranks_sharing_cpus(sockets, 6), nullptr).threads, 16);
  EXPECT_EQ(count_cpus(cpus(60, 10)), 10) << "a mask across a word boundary";
}

TEST(CpuThreads, ThisProcessMaskIsNotEmpty) { EXPECT_GE(count_cpus(process_cpu_mask()), 1); }
