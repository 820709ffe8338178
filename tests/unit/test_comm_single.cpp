// The one-process communicators: every collective is an identity or a copy, with the argument
// checks of the real implementations, so single-rank runs catch wrongly sized calls.
#include <gtest/gtest.h>

#include <set>

#include "megatron/parallel/parallel_state.h"
#include "test_util.h"

using namespace megatron;
using megatron::testing::error_of;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(SingleRankComm, ContextHasEveryRoleUnderItsOwnName) {
  const ParallelContext ctx = ParallelContext::single_process();
  std::set<std::string> names;
  for (const auto& c : ctx.communicators()) {
    EXPECT_EQ(c->size(), 1);
    EXPECT_EQ(c->world_ranks(), std::vector<int>{0});
    names.insert(c->name());
  }
  EXPECT_EQ(names.size(), 15u);
  EXPECT_TRUE(names.count("dp_cp") && names.count("expert_dp") && names.count("embedding") && names.count("pp_grad"));
  EXPECT_TRUE(names.count("expert_tp_ep") && names.count("expert_mp"));
}

TEST(SingleRankComm, CollectivesAreIdentitiesOrCopies) {
  SingleRankCommunicator comm("tp");
  Tensor x = Tensor::from_vector({1, 2, 3}, {3}, DType::bf16);
  comm.all_reduce(x, ReduceOp::avg);
  EXPECT_EQ(x.to_vector(), (std::vector<float>{1, 2, 3}));
  Tensor out = Tensor::zeros({3}, DType::bf16);
  comm.all_gather(out, x);
  EXPECT_EQ(out.to_vector(), x.to_vector());
  Tensor shard = Tensor::zeros({3}, DType::bf16);
  comm.reduce_scatter_async(shard, x)->wait();
  EXPECT_EQ(shard.to_vector(), x.to_vector());
  Tensor rows = Tensor::zeros({3, 1}, DType::bf16);
  const std::vector<int64_t> three{3};
  comm.all_to_all_v(rows, three, x.view({3, 1}), three);
  EXPECT_EQ(rows.to_vector(), x.to_vector());
  Tensor echo = Tensor::zeros({3}, DType::bf16);
  const std::vector<P2POp> ops{{P2POp::Kind::send, x, 0}, {P2POp::Kind::recv, echo, 0}};
  comm.batch_p2p(ops);
  EXPECT_EQ(echo.to_vector(), x.to_vector());
  CommHandlePtr h = comm.barrier_async();
  EXPECT_TRUE(h->test());
}

TEST(SingleRankComm, WrongCallsFailAsOnManyRanks) {
  SingleRankCommunicator comm("dp");
  Tensor x = Tensor::zeros({4}, DType::f32);
  Tensor big = Tensor::zeros({5}, DType::f32);
  EXPECT_TRUE(contains(error_of([&] { comm.all_gather(big, x); }), "dp all_gather: out has 5 elements"));
  EXPECT_TRUE(contains(error_of([&] { comm.reduce_scatter(x, big); }), "dp reduce_scatter: in has 5 elements"));
  Tensor ints = Tensor::zeros({2}, DType::i32);
  EXPECT_TRUE(contains(error_of([&] { comm.all_reduce(ints, ReduceOp::avg); }), "avg of i32 would truncate"));
  EXPECT_TRUE(contains(error_of([&] { comm.broadcast(x, 1); }), "root 1 is not a rank"));
  const std::vector<P2POp> unmatched{{P2POp::Kind::send, x, 0}};
  EXPECT_TRUE(contains(error_of([&] { comm.batch_p2p(unmatched); }), "never match"));
  const std::vector<int64_t> two{2}, four{4};
  Tensor rows = Tensor::zeros({2}, DType::f32);
  EXPECT_TRUE(contains(error_of([&] { comm.all_to_all_v(rows, two, x, two); }), "send_rows add up to 2"));
  EXPECT_TRUE(contains(error_of([&] { comm.all_to_all_v(x, four, x, four); }), "overlap"));
  Tensor part = x.slice(1, 3);
  EXPECT_TRUE(contains(error_of([&] { comm.reduce_scatter(part, x.slice(0, 2)); }), "not chunk 0"));
}

TEST(SingleRankComm, InitializeWithoutLauncherIsOneProcess) {
  ParallelOptions options;
  options.timeout_seconds = 90;
  ParallelState st = initialize_parallel({}, options);
  EXPECT_FALSE(st.process.launched());
  EXPECT_EQ(st.sizes.world, 1);
  EXPECT_EQ(st.ctx.dp->size(), 1);
  EXPECT_EQ(st.ctx.embedding->timeout(), 90);
  ParallelSizes tp2;
  tp2.tp = 2;
  EXPECT_TRUE(contains(error_of([&] { initialize_parallel(tp2); }), "not divisible by TP x CP x PP"));
}
