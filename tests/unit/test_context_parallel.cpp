// Context parallelism's pure parts: Megatron's load-balanced split worked by hand, and the rules
// `megatron train` checks before any work (each message names the value, the rule and the fix).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatron/context_parallel/load_balance.h"
#include "megatron/core/error.h"
#include "megatron/training/arguments.h"
#include "megatron/training/context_parallel.h"
#include "test_util.h"

namespace megatron {
namespace {

using Argv = std::vector<std::string>;

// CP = 2 on two ranks with dropout off (not built under CP), plus `extra`.
Argv cp2_argv(const Argv& extra = {}) {
  Argv a = testing::minimal_train_argv(
      {"--context-parallel-size", "2", "--attention-dropout", "0", "--hidden-dropout", "0"});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// argv with the value of --seq-length replaced (a flag given twice is an error).
Argv with_seq_length(Argv argv, int64_t S) {
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--seq-length") argv[i + 1] = std::to_string(S);
  return argv;
}

std::string parse_error(const Argv& argv, int64_t world_size) {
  try {
    parse_training_args(argv, world_size);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not in:\n" << text;
}

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

TEST(ContextParallelArgs, ValidLayoutParses) {
  const TrainingArgs args = parse_training_args(cp2_argv(), 4);
  EXPECT_EQ(args.parallel.context_parallel_size, 2);
  EXPECT_EQ(args.parallel.cp_comm_type, "p2p");
  EXPECT_EQ(args.data_parallel_size, 2);
}

TEST(ContextParallelArgs, SequenceMustSplitIntoTwoChunksPerRank) {
  EXPECT_TRUE(contains(parse_error(with_seq_length(cp2_argv(), 126), 2),
                       "--seq-length 126 is not divisible by 2 x --context-parallel-size = 4"));
  // Under sequence parallelism each rank's S/CP positions split over TP as well.
  EXPECT_TRUE(contains(
      parse_error(with_seq_length(cp2_argv({"--tensor-model-parallel-size", "2", "--sequence-parallel"}), 12), 4),
      "--seq-length 12 is not divisible by 2 x --context-parallel-size x "
      "--tensor-model-parallel-size = 8 under --sequence-parallel"));
}

TEST(ContextParallelArgs, CombinationsNotBuiltAreRefusedWithTheFix) {
  const Argv with_dropout = testing::minimal_train_argv({"--context-parallel-size", "2"});
  EXPECT_TRUE(contains(parse_error(with_dropout, 2), "add --attention-dropout 0 --hidden-dropout 0"));
  EXPECT_TRUE(contains(parse_error(cp2_argv({"--pipeline-model-parallel-size", "2"}), 4),
                       "context and pipeline parallelism together are not built yet"));
  EXPECT_TRUE(contains(parse_error(cp2_argv({"--window-size", "8,0"}), 2), "drop --window-size or use CP 1"));
  EXPECT_TRUE(contains(parse_error(cp2_argv({"--cp-comm-type", "a2a"}), 2), "use --cp-comm-type p2p"));
  EXPECT_TRUE(contains(parse_error(cp2_argv(), 3), "world size 3 is not a multiple of TP*CP*PP = 2"));
  EXPECT_TRUE(contains(parse_error(testing::minimal_train_argv({"--context-parallel-size", "0"}), 1),
                       "--context-parallel-size 0 must be positive"));
}

}  // namespace
}  // namespace megatron
