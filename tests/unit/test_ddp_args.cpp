// The data-parallel flags: defaults, what the world size derives, and the rules validate() keeps.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatron/training/arguments.h"
#include "test_util.h"

using namespace megatron;
using megatron::testing::error_of;

namespace {
std::vector<std::string> argv(const std::vector<std::string>& extra = {}) {
  return megatron::testing::minimal_train_argv(extra);
}
}  // namespace

TEST(DdpArgs, DefaultsAndWorldSize) {
  const TrainingArgs one = parse_training_args(argv());
  EXPECT_FALSE(one.use_distributed_optimizer || one.overlap_grad_reduce || one.overlap_param_gather);
  EXPECT_EQ(one.ddp_bucket_size, 0);
  EXPECT_EQ(one.distributed_timeout_minutes, 10.0);
  const TrainingArgs four =
      parse_training_args(argv({"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                                "--ddp-bucket-size", "1000", "--distributed-timeout-minutes", "0.5"}),
                          4);
  EXPECT_EQ(four.data_parallel_size, 4);
  EXPECT_EQ(four.global_batch_size, 8);  // micro-batch 2 x DP 4
  EXPECT_EQ(four.num_micro_batches(), 1);
  EXPECT_TRUE(four.use_distributed_optimizer && four.overlap_grad_reduce && four.overlap_param_gather);
  EXPECT_EQ(four.ddp_bucket_size, 1000);
  EXPECT_EQ(four.distributed_timeout_minutes, 0.5);
}

TEST(DdpArgs, RulesNameTheFlagAndTheFix) {
  EXPECT_NE(error_of([] {
              parse_training_args(argv({"--overlap-param-gather", "--overlap-grad-reduce"}));
            }).find("--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_training_args(argv({"--overlap-param-gather", "--use-distributed-optimizer"}));
            }).find("--overlap-param-gather needs"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_training_args(argv({"--ddp-bucket-size", "-5"}));
            }).find("--ddp-bucket-size -5 must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_training_args(argv({"--distributed-timeout-minutes", "0"}));
            }).find("--distributed-timeout-minutes 0 must be positive"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_training_args(argv({"--global-batch-size", "6"}), 4);
            }).find("is not a multiple of --micro-batch-size 2 x data-parallel size 4"),
            std::string::npos);
}
