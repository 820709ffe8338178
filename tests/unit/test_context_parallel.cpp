// Megatron's load-balanced split of a sequence over context-parallel ranks, worked by hand (the
// rules `megatron train` checks are in test_arguments.cpp).
#include <gtest/gtest.h>

#include <vector>

#include "megatron/context_parallel/load_balance.h"
#include "megatron/core/error.h"

namespace megatron {
namespace {

// S = 8 over C = 2: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (Megatron's
// example in get_batch_on_this_cp_rank).
TEST(ContextParallelSplit, RankHoldsChunksRAndTwoCMinusOneMinusR) {
  const context_parallel::CpChunks c0 = context_parallel::cp_chunks(8, 2, 0);
  EXPECT_EQ(c0.length, 2);
  EXPECT_EQ(c0.start(0), 0);
  EXPECT_EQ(c0.start(1), 6);
  const context_parallel::CpChunks c1 = context_parallel::cp_chunks(8, 2, 1);
  EXPECT_EQ(c1.start(0), 2);
  EXPECT_EQ(c1.start(1), 4);
  const Tensor positions =
      Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17}, {2, 8}, DType::i32);
  EXPECT_EQ(context_parallel::split_sequence(positions, 2, 0).to_vector(),
            (std::vector<float>{0, 1, 6, 7, 10, 11, 16, 17}));
  EXPECT_EQ(context_parallel::split_sequence(positions, 2, 1).to_vector(),
            (std::vector<float>{2, 3, 4, 5, 12, 13, 14, 15}));
  EXPECT_THROW(context_parallel::cp_chunks(10, 4, 0), Error);
}

}  // namespace
}  // namespace megatron
