// multirank-np: 2 4
// initialize_parallel builds, for every valid layout of the launched world, communicators whose
// members are rank_layout's groups, in rank_layout's order, and that really connect those ranks.
#include <algorithm>
#include <vector>

#include "megatron/core/strings.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

// Every combination of sizes in {1, 2, 4} that validate() accepts for `world`, less those where
// rank_layout finds the dense and expert pipeline groups differ (tp-pp-dp order with
// TP x CP != ETP x EP), which validate() does not reject yet.
std::vector<ParallelSizes> layouts(int64_t world) {
  std::vector<ParallelSizes> out;
  for (int64_t tp : {1, 2, 4})
    for (int64_t cp : {1, 2, 4})
      for (int64_t pp : {1, 2, 4})
        for (int64_t ep : {1, 2, 4})
          for (int64_t etp : {0, 1})
            for (bool order : {false, true}) {
              ParallelSizes s;
              s.world = world;
              s.tp = tp, s.cp = cp, s.pp = pp, s.ep = ep, s.etp = etp, s.tp_pp_dp_order = order;
              if (validate(s).empty() && error_of([&] { rank_layout(s, 0); }) == "(no error)") out.push_back(s);
            }
  return out;
}

std::string str(const ParallelSizes& s) {
  return concat("tp", s.tp, " cp", s.cp, " pp", s.pp, " ep", s.ep, " etp", s.etp, s.tp_pp_dp_order ? " tp-pp-dp" : "");
}

TEST(ParallelState, GroupsMatchTheRankLayoutAndConnectTheirMembers) {
  const int64_t world = process_info_from_env().world_size;
  const std::vector<ParallelSizes> all = layouts(world);
  ASSERT_GE(all.size(), world == 4 ? 20u : 4u);
  for (const ParallelSizes& sizes : all) {
    ParallelState st = make_state(sizes);
    const int rank = st.process.rank;
    const RankLayout l = rank_layout(sizes, rank);
    std::vector<int> everyone(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) everyone[size_t(r)] = r;
    const ParallelContext& c = st.ctx;
    const std::vector<std::pair<std::shared_ptr<Communicator>, std::vector<int>>> roles{
        {c.world, everyone},
        {c.tp, l.tp},
        {c.cp, l.cp},
        {c.dp, l.dp},
        {c.pp, l.pp},
        {c.pp_grad, l.pp},
        {c.dp_cp, l.dp_cp},
        {c.mp, l.model_parallel},
        {c.ep, l.ep},
        {c.expert_tp, l.expert_tp},
        {c.expert_dp, l.expert_dp},
        {c.expert_tp_ep, l.expert_tp_ep},
        {c.expert_mp, l.expert_mp},
        {c.embedding, l.embedding},
        {c.position_embedding, l.position_embedding}};
    for (size_t i = 0; i < roles.size(); ++i) {
      const auto& [comm, members] = roles[i];
      const bool member = std::find(members.begin(), members.end(), rank) != members.end();
      ASSERT_EQ(comm != nullptr, member) << str(sizes) << " role " << i << " rank " << rank;
      if (!member) continue;
      EXPECT_EQ(comm->world_ranks(), members) << str(sizes) << " " << comm->name();
      EXPECT_EQ(comm->size(), int(members.size())) << str(sizes) << " " << comm->name();
      EXPECT_EQ(members[size_t(comm->rank())], rank) << str(sizes) << " " << comm->name();
      // The sum of (global rank + 1) over the group proves who is really connected.
      Tensor t = Tensor::from_vector({float(rank + 1)}, {1});
      comm->all_reduce(t, ReduceOp::sum);
      float expect = 0;
      for (int m : members) expect += float(m + 1);
      ASSERT_EQ(t.item(0), expect) << str(sizes) << " " << comm->name();
    }
  }
}

TEST(ParallelState, RolesWithTheSameGroupsShareOneCommunicator) {
  ParallelSizes sizes;
  sizes.tp = process_info_from_env().world_size;  // PP = CP = 1: mp = tp
  ParallelState tp_only = make_state(sizes);
  EXPECT_EQ(tp_only.ctx.mp, tp_only.ctx.tp);
  EXPECT_NE(tp_only.ctx.tp->name().find("tp/mp"), std::string::npos) << tp_only.ctx.tp->name();
  ParallelState dp_only = make_state({});  // CP = 1: dp_cp = dp
  EXPECT_EQ(dp_only.ctx.dp_cp, dp_only.ctx.dp);
  EXPECT_NE(dp_only.ctx.tp, dp_only.ctx.cp) << "groups of one process stay apart, each with its own name";
  ParallelSizes pp_only;
  pp_only.pp = process_info_from_env().world_size;
  ParallelState pipeline = make_state(pp_only);
  EXPECT_NE(pipeline.ctx.pp_grad, pipeline.ctx.pp) << "the pipeline's gradients have a communicator of their own";
  EXPECT_EQ(pipeline.ctx.pp_grad->name(), "pp_grad");
}

TEST(ParallelState, BadSizesFailOnEveryRankWithTheRule) {
  ParallelSizes sizes;
  sizes.tp = 3;
  EXPECT_NE(error_of([&] { make_state(sizes); }).find("not divisible by TP x CP x PP"), std::string::npos);
  ParallelSizes wrong_world;
  wrong_world.world = process_info_from_env().world_size + 1;
  EXPECT_NE(error_of([&] { make_state(wrong_world); }).find("were launched"), std::string::npos);
}

TEST(ParallelState, TimeoutReachesEveryCommunicator) {
  ParallelState st = make_state({});
  st.set_timeout(0.25 * 60);  // --distributed-timeout-minutes 0.25
  for (const auto& comm : st.ctx.communicators()) EXPECT_EQ(comm->timeout(), 15.0) << comm->name();
  EXPECT_NE(error_of([&] { st.set_timeout(0); }).find("must be positive"), std::string::npos);
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
