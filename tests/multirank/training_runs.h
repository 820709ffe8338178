#pragma once
// Helpers of the multi-rank tests that train with `pretrain`: command lines, runs on a context or
// on one process, curves compared with a relative tolerance, a directory all ranks share.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "megatron/training/arguments.h"
#include "megatron/training/training.h"
#include "test_util.h"

namespace megatron::testing {

inline std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

inline TrainingSummary train_single_rank(const std::vector<std::string>& argv) {
  return pretrain(parse_training_args(argv, 1), ParallelContext::single_process(), Device::cpu());
}

inline TrainingSummary train_on(const ParallelContext& ctx, const std::vector<std::string>& argv) {
  return pretrain(parse_training_args(argv, ctx.world->size()), ctx, Device::cpu());
}

// actual[i] against expected[first_expected + i], relative to the expected value.
inline void expect_close(const std::vector<double>& expected, const std::vector<double>& actual, size_t first_expected,
                         double tolerance, const std::string& what) {
  ASSERT_EQ(actual.size() + first_expected, expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double e = expected[first_expected + i];
    EXPECT_LE(std::abs(actual[i] - e), tolerance * std::abs(e))
        << what << ": value " << first_expected + i << " is " << actual[i] << ", single rank " << e;
  }
}

// A directory every rank sees: rank 0 creates it (`dir`, null elsewhere) and broadcasts its path.
inline std::string shared_directory(Communicator& world, const TempDir* dir) {
  Tensor path = Tensor::zeros({512}, DType::u8);
  if (dir) std::memcpy(path.raw(), dir->path().c_str(), dir->path().size());
  world.broadcast(path, 0);
  return static_cast<const char*>(path.raw());
}

}  // namespace megatron::testing
