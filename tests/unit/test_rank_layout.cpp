// Megatron's rank layout against the worked examples of megatron-compat.md §7.2, which were
// verified with Megatron's own function.
#include <gtest/gtest.h>

#include "megatron/core/error.h"
#include "megatron/parallel/rank_layout.h"

using namespace megatron;

TEST(RankLayout, World8Tp2Pp2Dp2) {
  const ParallelSizes s{.world = 8, .tp = 2, .pp = 2};
  EXPECT_EQ(rank_groups(s, "tp"), (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(rank_groups(s, "dp"), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(rank_groups(s, "dp-cp"), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(rank_groups(s, "pp"), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(rank_groups(s, "tp-pp"), (RankGroups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(rank_groups(s, "tp-dp"), (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  const RankLayout l = rank_layout(s, 5);
  EXPECT_EQ(l.embedding, (std::vector<int>{1, 5}));
  EXPECT_EQ(l.position_embedding, (std::vector<int>{1}));
  EXPECT_EQ(rank_layout(s, 5, /*tied_embeddings=*/false).embedding, (std::vector<int>{1}));
  EXPECT_EQ(l.tp_rank, 1);
  EXPECT_EQ(l.dp_rank, 0);
  EXPECT_EQ(l.pp_rank, 1);
}

TEST(RankLayout, TpPpDpOrder) {
  const ParallelSizes s{.world = 8, .tp = 2, .pp = 2, .tp_pp_dp_order = true};
  EXPECT_EQ(rank_groups(s, "dp"), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(rank_groups(s, "pp"), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

TEST(RankLayout, ContextParallel) {
  const ParallelSizes s{.world = 8, .tp = 2, .cp = 2};
  EXPECT_EQ(rank_groups(s, "cp"), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(rank_groups(s, "dp"), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(rank_groups(s, "dp-cp"), (RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
}

TEST(RankLayout, ExpertParallel) {
  const ParallelSizes s{.world = 8, .tp = 2, .ep = 4, .etp = 1};
  EXPECT_EQ(rank_groups(s, "dp"), (RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(rank_groups(s, "ep", true), (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(rank_groups(s, "dp", true), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

// Expert TP = TP (the default): the MoE layers exchange tokens within the TP x EP group, TP
// varying fastest, as Megatron's get_expert_tensor_and_model_parallel_group.
TEST(RankLayout, ExpertTensorAndExpertParallel) {
  const ParallelSizes s{.world = 8, .tp = 2, .ep = 2};
  EXPECT_EQ(rank_groups(s, "tp-ep", true), (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(rank_groups(s, "ep", true), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(rank_groups(s, "tp", true), rank_groups(s, "tp"));
  EXPECT_EQ(rank_layout(s, 5).expert_tp_ep, (std::vector<int>{4, 5, 6, 7}));
  // Expert TP 1 under TP 2: the two TP ranks of a replica are EP ranks, holding whole experts.
  const ParallelSizes e{.world = 4, .tp = 2, .ep = 2, .etp = 1};
  EXPECT_EQ(rank_groups(e, "tp-ep", true), (RankGroups{{0, 1}, {2, 3}}));
  EXPECT_EQ(rank_groups(e, "tp-ep-pp", true), (RankGroups{{0, 1}, {2, 3}}));
  EXPECT_EQ(rank_groups(e, "dp", true), (RankGroups{{0, 2}, {1, 3}}));
  EXPECT_EQ(rank_groups(e, "tp"), (RankGroups{{0, 1}, {2, 3}}));
}

TEST(RankLayout, EveryRankInExactlyOneGroupOfEachKind) {
  const ParallelSizes s{.world = 24, .tp = 2, .cp = 1, .pp = 3, .ep = 2, .etp = 1};
  for (const char* axes : {"tp", "dp", "pp", "tp-pp", "dp-cp"}) {
    std::vector<int> seen(24, 0);
    for (const auto& g : rank_groups(s, axes))
      for (int r : g) ++seen[size_t(r)];
    for (int c : seen) EXPECT_EQ(c, 1) << axes;
  }
}

TEST(RankLayout, InvalidSizesAreReported) {
  const auto errors = validate(ParallelSizes{.world = 6, .tp = 4});
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("not divisible by TP x CP x PP"), std::string::npos);
  EXPECT_THROW(rank_groups(ParallelSizes{.world = 6, .tp = 4}, "tp"), Error);
}
