#include "megatron/parallel/cpu_threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdlib>
#include <string>
#include <thread>

#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/parallel/mpi_check.h"

namespace megatron {

namespace {
// Words of a mask: enough for every CPU the system is configured with, and for glibc's cpu_set_t.
size_t mask_words() {
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
  return (size_t(std::max<long>(configured, CPU_SETSIZE)) + 63) / 64;
}

// The first value of OMP_NUM_THREADS ("8", or "8,2" for nested levels).
int parse_omp_num_threads(const char* text) {
  const std::string s(text);
  const std::string first = s.substr(0, s.find(','));
  const size_t begin = first.find_first_not_of(' '), end = first.find_last_not_of(' ');
  const std::string trimmed = begin == std::string::npos ? "" : first.substr(begin, end - begin + 1);
  int value = 0;
  const auto [ptr, ec] = std::from_chars(trimmed.data(), trimmed.data() + trimmed.size(), value);
  MEGATRON_CHECK(!trimmed.empty() && ec == std::errc() && ptr == trimmed.data() + trimmed.size() && value > 0,
                 "OMP_NUM_THREADS='" << s << "' is not a positive number of threads; set it to the threads each "
                                     << "rank should use (e.g. OMP_NUM_THREADS=4), or unset it to divide this "
                                     << "node's cores among its ranks");
  return value;
}
}  // namespace

int count_cpus(const CpuMask& mask) {
  int n = 0;
  for (const uint64_t word : mask) n += std::popcount(word);
  return n;
}

int ranks_sharing_cpus(const std::vector<CpuMask>& node_masks, size_t self) {
  MEGATRON_CHECK(self < node_masks.size(),
                 "rank " << self << " is not among the " << node_masks.size() << " masks of its node");
  const CpuMask& mine = node_masks[self];
  int sharing = 0;
  for (const CpuMask& other : node_masks) {
    bool overlaps = false;
    for (size_t w = 0; w < std::min(mine.size(), other.size()); ++w) overlaps = overlaps || (mine[w] & other[w]) != 0;
    sharing += overlaps ? 1 : 0;
  }
  return std::max(sharing, 1);  // an empty mask overlaps nothing, not even itself
}

CpuThreads cpu_threads_per_rank(int cpus, int sharing_ranks, const char* omp_num_threads) {
  MEGATRON_CHECK(cpus >= 1 && sharing_ranks >= 1, "a rank needs at least one CPU and one rank sharing it (got "
                                                      << cpus << " CPUs, " << sharing_ranks << " ranks)");
  CpuThreads t{.cpus = cpus, .sharing_ranks = sharing_ranks};
  if (omp_num_threads != nullptr) {
    t.threads = parse_omp_num_threads(omp_num_threads);
    t.from_environment = true;
  } else {
    t.threads = std::max(1, cpus / sharing_ranks);
  }
  return t;
}

CpuMask process_cpu_mask() {
  const size_t words = mask_words();
  CpuMask mask(words, 0);
  const size_t cpus = words * 64;
  cpu_set_t* set = CPU_ALLOC(cpus);
  const size_t bytes = CPU_ALLOC_SIZE(cpus);
  if (set != nullptr && sched_getaffinity(0, bytes, set) == 0) {
    for (size_t c = 0; c < cpus; ++c)
      if (CPU_ISSET_S(c, bytes, set)) mask[c / 64] |= uint64_t(1) << (c % 64);
  } else {
    const size_t all = std::max(1u, std::thread::hardware_concurrency());
    for (size_t c = 0; c < std::min(all, cpus); ++c) mask[c / 64] |= uint64_t(1) << (c % 64);
  }
  if (set != nullptr) CPU_FREE(set);
  return mask;
}

CpuThreads configure_cpu_threads(const MpiRuntime* mpi, const EnvLookup& getenv) {
  const CpuMask mine = process_cpu_mask();
  std::vector<CpuMask> node_masks{mine};
  size_t self = 0;
  if (mpi != nullptr) {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "node");
    int node_rank = 0, node_size = 1;
    MPI_CHECK(MPI_Comm_rank(node, &node_rank), "node");
    MPI_CHECK(MPI_Comm_size(node, &node_size), "node");
    std::vector<uint64_t> all(mine.size() * size_t(node_size));
    MPI_CHECK(
        MPI_Allgather(mine.data(), int(mine.size()), MPI_UINT64_T, all.data(), int(mine.size()), MPI_UINT64_T, node),
        "node");
    MPI_CHECK(MPI_Comm_free(&node), "node");
    node_masks.clear();
    for (int r = 0; r < node_size; ++r)
      node_masks.emplace_back(all.begin() + std::ptrdiff_t(size_t(r) * mine.size()),
                              all.begin() + std::ptrdiff_t(size_t(r + 1) * mine.size()));
    self = size_t(node_rank);
  }
  const CpuThreads t = cpu_threads_per_rank(std::max(1, count_cpus(mine)), ranks_sharing_cpus(node_masks, self),
                                            getenv("OMP_NUM_THREADS"));
  if (!t.from_environment) omp_set_num_threads(t.threads);
  LOG_INFO("> CPU threads per rank: " << t.threads << " ("
                                      << (t.from_environment ? std::string("OMP_NUM_THREADS")
                                                             : std::to_string(t.cpus) +
                                                                   " CPU(s) in this rank's affinity mask, shared by " +
                                                                   std::to_string(t.sharing_ranks) +
                                                                   " rank(s) on this node; OMP_NUM_THREADS overrides")
                                      << ")");
  return t;
}

CpuThreads configure_cpu_threads(const MpiRuntime* mpi) {
  return configure_cpu_threads(mpi, [](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace megatron
