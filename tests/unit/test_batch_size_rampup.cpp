// Megatron's batch-size ramp (RampupBatchsizeNumMicroBatchesCalculator, update_train_iters) on
// values worked out by hand from its formula (batch_size_rampup.h).
#include <gtest/gtest.h>

#include "megatron/core/error.h"
#include "megatron/training/arguments.h"
#include "megatron/training/batch_size_rampup.h"
#include "test_util.h"

using namespace megatron;

// START 4, INCREMENT 4, SAMPLES 30, GBS 16: (16 - 4) / 4 = 3 increments of 30 / 3 = 10 samples.
TEST(BatchSizeRampup, WholeSamplesPerIncrement) {
  const BatchSizeRampup r{4, 4, 30, 16};
  const std::pair<int64_t, int64_t> expected[] = {{0, 4},   {9, 4},   {10, 8},  {19, 8},
                                                  {20, 12}, {29, 12}, {30, 16}, {31, 16}};
  for (const auto& [consumed, size] : expected) EXPECT_EQ(r.batch_size_at(consumed), size) << consumed;
  // Ramp 4, 4, 4, 8, 12 (32 consumed > 30), then (100 - 32) / 16 = 4 (the 4 left over dropped).
  EXPECT_EQ(r.train_iterations(100), 9);
  // Ramp stops once consumed > train samples: 4, 4, 4 (12 > 10).
  EXPECT_EQ(r.train_iterations(10), 3);
}

// START 3, INCREMENT 3, SAMPLES 10, GBS 12: 3 increments of 10 / 3 = 3.333... samples (a real
// number, as Megatron's): 3 at 0 and 3 consumed (floor(0.9) = 0), 6 at 6 (floor(1.8) = 1), 12 once
// consumed > 10. Iterations for 40 samples: 3, 3, 6 (12 consumed), then (40 - 12) / 12 = 2.
TEST(BatchSizeRampup, FractionalSamplesPerIncrement) {
  const BatchSizeRampup r{3, 3, 10, 12};
  EXPECT_EQ(r.batch_size_at(0), 3);
  EXPECT_EQ(r.batch_size_at(3), 3);
  EXPECT_EQ(r.batch_size_at(6), 6);
  EXPECT_EQ(r.batch_size_at(9), 9);    // floor(2.7) = 2
  EXPECT_EQ(r.batch_size_at(10), 12);  // floor(3.0) = 3
  EXPECT_EQ(r.batch_size_at(12), 12);
  EXPECT_EQ(r.train_iterations(40), 5);
}

TEST(BatchSizeRampup, ArgumentRules) {
  const auto error = [](std::vector<std::string> extra) {
    std::vector<std::string> argv = megatron::testing::minimal_train_argv();
    argv.insert(argv.end(), extra.begin(), extra.end());
    try {
      parse_training_args(argv);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({"--rampup-batch-size", "2", "2", "10", "--global-batch-size", "8"})
                .find("--rampup-batch-size needs --train-samples"),
            std::string::npos);
  EXPECT_NE(error({"--rampup-batch-size", "2", "x", "10"}).find("must be three whole numbers"), std::string::npos);
  EXPECT_NE(error({"--rampup-batch-size", "2", "4", "10", "--global-batch-size", "8"}).find("in whole increments"),
            std::string::npos);
  EXPECT_NE(error({"--rampup-batch-size", "3", "3", "10", "--global-batch-size", "12"})
                .find("must be multiples of --micro-batch-size x data-parallel size = 2"),
            std::string::npos);
}
