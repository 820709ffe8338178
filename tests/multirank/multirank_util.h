#pragma once
// Helpers of the multi-rank tests: every rank runs the same gtest program under mpirun, sharing
// one MpiRuntime; rank 0 prints the usual gtest output and the other ranks only their failures.
// Inputs follow nccl-tests: values are a function of (seed, rank, index) and small integers, so
// sums are exact in every dtype used here and results compare with ==.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "megatron/parallel/launch.h"
#include "megatron/parallel/parallel_state.h"
#include "test_util.h"

namespace megatron::testing {

inline std::shared_ptr<MpiRuntime>& mpi_runtime() {
  static std::shared_ptr<MpiRuntime> runtime;
  return runtime;
}

// An integer in [-8, 8] from (seed, rank, index): exact in bf16 and in sums over a few ranks.
inline float value(uint64_t seed, int rank, int64_t index) {
  uint64_t x =
      seed * 0x9E3779B97F4A7C15ull + uint64_t(rank) * 0xBF58476D1CE4E5B9ull + uint64_t(index) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86653D7D3ull;
  x ^= x >> 29;
  return float(int64_t(x % 17) - 8);
}

// A short timeout: a test that hangs fails with the watchdog's report instead. The pipeline
// channels are built, so interleaved runs overlap their p2p as Megatron's default has them.
inline ParallelState make_state(ParallelSizes sizes, double timeout_seconds = 20) {
  ParallelOptions options;
  options.timeout_seconds = timeout_seconds;
  options.pipeline_channels = true;
  options.mpi = mpi_runtime();
  return initialize_parallel(sizes, options);
}

// A directory every rank of MPI_COMM_WORLD sees: rank 0 passes the one it created (the others
// null) and broadcasts its path. Host-side MPI, so it works whatever the communicators' device.
inline std::string shared_directory(const TempDir* dir) {
  char path[512] = {};
  if (dir) std::strncpy(path, dir->path().c_str(), sizeof path - 1);
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

// Prints failed assertions of ranks other than 0, prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

inline int multirank_main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const ProcessInfo process = process_info_from_env();
  if (process.launched()) mpi_runtime() = std::make_shared<MpiRuntime>(process);
  if (process.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(process.rank));
  }
  const int result = RUN_ALL_TESTS();
  mpi_runtime().reset();
  return result;
}

}  // namespace megatron::testing
