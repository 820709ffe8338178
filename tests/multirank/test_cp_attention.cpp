// multirank-np: 2 4
// Context-parallel attention over every rank of the world as one CP group equals full causal
// attention on one rank, in f64, for Megatron's comm types: the ring
// (context_parallel/ring_attention.h, --cp-comm-type p2p), its blocks on all-gathered keys and
// values (allgather), the all-to-all over heads (all_to_all_attention.h, a2a) and, at CP = 4 as
// 2 x 2, the all-to-all inside pairs of ranks around the ring across them (a2a+p2p). Each rank's
// output, lse and gradients of q, k and v equal the full computation's rows of the two chunks that
// rank holds (Megatron's load-balanced split: chunks r and 2C-1-r), with grouped-query heads, with
// and without document masks (segment ids whose documents cross the chunk boundaries).
//
// Tolerance 1e-12 relative to the largest reference value: CP adds the same f64 terms in another
// order (the ring block by block, merged through the log-sum-exp; the all-to-all not at all), a few
// units of 2^-53 each; a block attended under the wrong mask, a missed or doubled block, a chunk
// or head sent to the wrong rank is off by O(1).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "megatron/context_parallel/all_to_all_attention.h"
#include "megatron/context_parallel/load_balance.h"
#include "megatron/context_parallel/ring_attention.h"
#include "megatron/ops/elementwise.h"
#include "multirank/multirank_util.h"
#include "unit/op_test_util.h"

namespace megatron::testing {
namespace {

constexpr int64_t S = 16, B = 2, NH = 8, G = 4, HS = 8;  // heads and groups divide by CP = 2 and 4 (a2a)

void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  EXPECT_TRUE(test::all_close(actual, expected, 0.0, 1e-12 * test::max_abs(expected))) << what;
}

// This rank's rows of a sequence-major (S, ...) tensor: its two chunks, in local order.
Tensor local_rows(const Tensor& full, int64_t cp, int64_t rank) {
  const context_parallel::CpChunks c = context_parallel::cp_chunks(full.dim(0), cp, rank);
  Shape shape = full.shape();
  shape[0] = 2 * c.length;
  Tensor local = Tensor::empty(shape, full.dtype());
  for (int half = 0; half < 2; ++half) {
    Tensor rows = local.slice(half * c.length, (half + 1) * c.length);
    ops::cast(rows, full.slice(c.start(half), c.start(half) + c.length));
  }
  return local;
}

// This rank's positions of lse (B,NH,S): through (S, B*NH) rows.
Tensor local_lse(const Tensor& lse, int64_t cp, int64_t rank) {
  Tensor sequence_major = Tensor::empty({S, B * NH}, lse.dtype());
  ops::transpose01(sequence_major, lse.view({B * NH, S}));
  const Tensor rows = local_rows(sequence_major, cp, rank);
  Tensor out = Tensor::empty({B * NH, rows.dim(0)}, lse.dtype());
  ops::transpose01(out, rows);
  return out.view({B, NH, rows.dim(0)});
}

// Documents of varied lengths whose boundaries fall inside and between chunks.
Tensor document_ids() {
  Tensor ids = Tensor::empty({B, S}, DType::i32);
  const int64_t boundaries[B][3] = {{3, 7, 12}, {9, 10, S}};
  for (int64_t b = 0; b < B; ++b) {
    int32_t doc = 0;
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t x : boundaries[b])
        if (s == x) ++doc;
      ids.data<int32_t>()[b * S + s] = doc;
    }
  }
  return ids;
}

// One of the CP attentions: forward and backward with the op's contract on the local rows, over
// the groups of `ctx`; `hierarchical` builds the CP group as Megatron's two levels (a2a+p2p).
struct CpAttention {
  std::function<void(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                     const ops::AttentionParams& params, const ParallelContext& ctx)>
      forward;
  std::function<void(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& out, const Tensor& lse, const ops::AttentionParams& params,
                     const ParallelContext& ctx)>
      backward;
  std::vector<int64_t> hierarchical{};
};

// One of the comm types over the whole CP group.
template <auto Forward, auto Backward>
CpAttention over_cp() {
  return {[](Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
             const ops::AttentionParams& params,
             const ParallelContext& ctx) { Forward(out, lse, q, k, v, params, *ctx.cp); },
          [](Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
             const Tensor& out, const Tensor& lse, const ops::AttentionParams& params,
             const ParallelContext& ctx) { Backward(dq, dk, dv, dout, q, k, v, out, lse, params, *ctx.cp); }};
}

const CpAttention kRing =
    over_cp<context_parallel::ring_attention_forward, context_parallel::ring_attention_backward>();
const CpAttention kAllToAll =
    over_cp<context_parallel::all_to_all_attention_forward, context_parallel::all_to_all_attention_backward>();
const CpAttention kAllGather =
    over_cp<context_parallel::all_gather_attention_forward, context_parallel::all_gather_attention_backward>();
// a2a+p2p at CP = 4 as 2 x 2: all-to-all over pairs of consecutive CP ranks, the ring across pairs.
const CpAttention kHierarchical{
    [](Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionParams& params,
       const ParallelContext& ctx) {
      context_parallel::hierarchical_attention_forward(out, lse, q, k, v, params, *ctx.cp_a2a, *ctx.cp_p2p);
    },
    [](Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
       const Tensor& out, const Tensor& lse, const ops::AttentionParams& params, const ParallelContext& ctx) {
      context_parallel::hierarchical_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, params, *ctx.cp_a2a,
                                                        *ctx.cp_p2p);
    },
    {2, 2}};

void cp_matches_full_attention(const CpAttention& attention, bool documents) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ParallelSizes sizes;
  sizes.cp = world;
  sizes.hierarchical_cp = attention.hierarchical;
  if (!sizes.hierarchical_cp.empty() && world != 4) GTEST_SKIP() << "a2a+p2p is tested at CP = 4 as 2 x 2";
  ParallelState st = make_state(sizes, 30);
  Communicator& cp = *st.ctx.cp;
  ASSERT_EQ(cp.size(), world);
  const int64_t C = cp.size(), rank = cp.rank();

  const Tensor q = test::randn({S, B, NH, HS}, DType::f64, 11);
  const Tensor k = test::randn({S, B, G, HS}, DType::f64, 12);
  const Tensor v = test::randn({S, B, G, HS}, DType::f64, 13);
  const Tensor dout = test::randn({S, B, NH, HS}, DType::f64, 14);
  ops::AttentionParams params{.causal = true, .softmax_scale = 0.35f};
  if (documents) params.segment_ids = document_ids();

  Tensor out = Tensor::empty(q.shape(), DType::f64), lse = Tensor::empty({B, NH, S}, DType::f64);
  ops::attention_forward(out, lse, q, k, v, params);
  Tensor dq = Tensor::empty(q.shape(), DType::f64), dk = Tensor::empty(k.shape(), DType::f64);
  Tensor dv = Tensor::empty(v.shape(), DType::f64);
  ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, params);

  const Tensor q_local = local_rows(q, C, rank), k_local = local_rows(k, C, rank), v_local = local_rows(v, C, rank);
  ops::AttentionParams local_params = params;
  if (documents) local_params.segment_ids = context_parallel::split_sequence(params.segment_ids, C, rank);
  Tensor cp_out = test::poisoned(q_local.shape(), DType::f64);
  Tensor cp_lse = test::poisoned({B, NH, q_local.dim(0)}, DType::f64);
  attention.forward(cp_out, cp_lse, q_local, k_local, v_local, local_params, st.ctx);
  expect_close(cp_out, local_rows(out, C, rank), "output");
  expect_close(cp_lse, local_lse(lse, C, rank), "lse");

  Tensor cp_dq = test::poisoned(q_local.shape(), DType::f64);
  Tensor cp_dk = test::poisoned(k_local.shape(), DType::f64), cp_dv = test::poisoned(v_local.shape(), DType::f64);
  attention.backward(cp_dq, cp_dk, cp_dv, local_rows(dout, C, rank), q_local, k_local, v_local, cp_out, cp_lse,
                     local_params, st.ctx);
  expect_close(cp_dq, local_rows(dq, C, rank), "dq");
  expect_close(cp_dk, local_rows(dk, C, rank), "dk");
  expect_close(cp_dv, local_rows(dv, C, rank), "dv");
}

TEST(RingAttention, CausalGroupedQueryMatchesFullAttention) { cp_matches_full_attention(kRing, false); }

TEST(RingAttention, DocumentMasksMatchFullAttention) { cp_matches_full_attention(kRing, true); }

TEST(AllGatherAttention, CausalGroupedQueryMatchesFullAttention) { cp_matches_full_attention(kAllGather, false); }

TEST(AllGatherAttention, DocumentMasksMatchFullAttention) { cp_matches_full_attention(kAllGather, true); }

TEST(AllToAllAttention, CausalGroupedQueryMatchesFullAttention) { cp_matches_full_attention(kAllToAll, false); }

TEST(AllToAllAttention, DocumentMasksMatchFullAttention) { cp_matches_full_attention(kAllToAll, true); }

TEST(HierarchicalAttention, CausalGroupedQueryMatchesFullAttention) { cp_matches_full_attention(kHierarchical, false); }

TEST(HierarchicalAttention, DocumentMasksMatchFullAttention) { cp_matches_full_attention(kHierarchical, true); }

// Megatron's hierarchical groups (create_hierarchical_parallel_groups) at CP = 8 as 2 x 4, TP = 2
// (CP group members 0, 2, ..., 14 and 1, 3, ..., 15): all-to-all over consecutive CP members, the
// ring over every second one, worked by hand.
TEST(HierarchicalAttention, GroupsFollowMegatronsLayout) {
  const ParallelSizes sizes{.world = 16, .tp = 2, .cp = 8, .hierarchical_cp = {2, 4}};
  EXPECT_EQ(hierarchical_cp_groups(sizes, 0),
            (RankGroups{{0, 2}, {4, 6}, {8, 10}, {12, 14}, {1, 3}, {5, 7}, {9, 11}, {13, 15}}));
  EXPECT_EQ(hierarchical_cp_groups(sizes, 1),
            (RankGroups{{0, 4, 8, 12}, {2, 6, 10, 14}, {1, 5, 9, 13}, {3, 7, 11, 15}}));
  EXPECT_FALSE(validate(ParallelSizes{.world = 16, .tp = 2, .cp = 8, .hierarchical_cp = {2, 2}}).empty());
}

// Megatron's case rules, worked by hand for C = 4, rank 1: step 1 holds rank 0's chunks (0, 7),
// both q chunks (1, 6) see chunk 0 and neither sees 7; steps 2 and 3 hold ranks 3 (3, 4) and 2
// (2, 5), which only q chunk 6 sees, both of them.
TEST(RingAttention, StepBlocksFollowTheTruePositions) {
  using context_parallel::ring_step_blocks;
  using context_parallel::RingBlock;
  EXPECT_TRUE(ring_step_blocks(0, 1, 4).empty());
  EXPECT_EQ(ring_step_blocks(1, 1, 4), (std::vector<RingBlock>{{0, 0}, {1, 0}}));
  EXPECT_EQ(ring_step_blocks(2, 1, 4), (std::vector<RingBlock>{{1, 0}, {1, 1}}));
  EXPECT_EQ(ring_step_blocks(3, 1, 4), (std::vector<RingBlock>{{1, 0}, {1, 1}}));
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
