// multirank-np: 2 4
// Context parallelism in `megatron train` (each micro-batch split into 2 x CP load-balanced chunks
// at the loader's boundary, ring attention with RoPE at the chunks' true positions, the loss
// gradient scaled by CP and the gradients averaged over DP x CP, the loss summed over DP x CP)
// trains the single-rank model. GPT-2 style (learned positions) and LLaMA style (GQA, RoPE),
// dropout off (not built under CP), 2 layers, 10 iterations with a validation at 10, in f64:
//   2 ranks: CP=2 (both styles), CP=2 with document masks and reset position ids (LLaMA), the
//            same with --cp-comm-type a2a and allgather, CP=2 with core attention recomputed in
//            backward (the ring runs again);
//   4 ranks: CP=4 (both styles), CP=4 a2a (GPT), CP=4 allgather (LLaMA), CP=4 a2a+p2p as 2 x 2
//            (LLaMA: the all-to-all inside rank pairs, the ring across), CP=2 x DP=2 with the distributed optimizer
//            (GPT), CP=2 x TP=2 with sequence parallelism (LLaMA).
// Then a checkpoint (fp32, LLaMA): CP=2 saves at iteration 5 and one rank (CP=1) resumes it on
// the same curve.
//
// Tolerance 200 u relative (u = 2^-53 in f64, 2^-24 in fp32), as the TP and PP tests: CP computes
// the same sums in other orders (attention block by block merged through the log-sum-exp, the
// gradients summed over the CP ranks' tokens), each regrouping moving a result by a few u. A defect
// (a chunk at the wrong RoPE position, a block under the wrong mask, the loss scaled by the wrong
// factor) moves the curve by 1e-3 or more.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

constexpr int64_t kIterations = 10;

struct Layout {
  std::string name;
  ModelStyle style;
  bool documents;
  ParallelSizes sizes;
  std::vector<std::string> flags;
};

std::vector<Layout> layouts(int world) {
  using enum ModelStyle;
  const std::vector<std::string> cp2 = {"--context-parallel-size", "2"};
  if (world == 2)
    return {{"CP=2", gpt, false, {.cp = 2}, cp2},
            {"CP=2", llama, false, {.cp = 2}, cp2},
            {"CP=2 document masks", llama, true, {.cp = 2}, cp2},
            {"CP=2 a2a document masks", llama, true, {.cp = 2}, with(cp2, {"--cp-comm-type", "a2a"})},
            {"CP=2 allgather document masks", llama, true, {.cp = 2}, with(cp2, {"--cp-comm-type", "allgather"})},
            {"CP=2 selective recompute",
             llama,
             false,
             {.cp = 2},
             with(cp2, {"--recompute-granularity", "selective", "--recompute-modules", "core_attn"})}};
  return {{"CP=4", gpt, false, {.cp = 4}, {"--context-parallel-size", "4"}},
          {"CP=4", llama, false, {.cp = 4}, {"--context-parallel-size", "4"}},
          {"CP=4 a2a", gpt, false, {.cp = 4}, {"--context-parallel-size", "4", "--cp-comm-type", "a2a"}},
          {"CP=4 allgather", llama, false, {.cp = 4}, {"--context-parallel-size", "4", "--cp-comm-type", "allgather"}},
          {"CP=4 a2a+p2p (2 x 2)",
           llama,
           false,
           {.cp = 4, .hierarchical_cp = {2, 2}},
           {"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2",
            "2"}},
          {"CP=2 x DP=2 distributed optimizer", gpt, false, {.cp = 2}, with(cp2, {"--use-distributed-optimizer"})},
          {"CP=2 x TP=2 SP",
           llama,
           false,
           {.tp = 2, .cp = 2},
           with(cp2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"})}};
}

TEST(CpTraining, EveryLayoutFollowsTheSingleRank) {
  const int world = int(make_state({}).ctx.world->size());
  const double tolerance = 200 * 0x1p-53;
  std::map<std::pair<ModelStyle, bool>, TrainingSummary> single;
  for (const Layout& l : layouts(world)) {
    const auto key = std::pair{l.style, l.documents};
    if (!single.contains(key))
      single[key] = run_f64(ParallelContext::single_process(),
                            with(tiny_cp_run(l.style, kIterations, l.documents), {"--log-params-norm"}));
  }
  // The document masks must matter in these batches, or their layout would test nothing.
  if (single.contains({ModelStyle::llama, true})) {
    EXPECT_NE(single.at({ModelStyle::llama, true}).train_losses, single.at({ModelStyle::llama, false}).train_losses);
  }
  for (const Layout& l : layouts(world)) {
    const ParallelState st = make_state(l.sizes, 60);
    ASSERT_EQ(st.ctx.cp->size(), l.sizes.cp);
    const std::string what = std::string(style_name(l.style)) + " " + l.name;
    const TrainingSummary& want = single.at({l.style, l.documents});
    ASSERT_EQ(want.valid_losses.size(), 1u);
    // --log-params-norm: the TP x SP layout's replicated weights counted on TP rank 0 alone.
    const TrainingSummary s =
        run_f64(st.ctx, with(with(tiny_cp_run(l.style, kIterations, l.documents), {"--log-params-norm"}), l.flags));
    expect_same_run(want, s, tolerance, what, st.ctx.world->rank() == 0);
  }
}

// --qk-layernorm (LLaMA style) with the whole world as CP: the norms normalise each rank's own
// tokens' heads, their weights' gradients summed over the CP ranks.
TEST(CpTraining, QkLayernormFollowsTheSingleRank) {
  const int world = int(make_state({}).ctx.world->size());
  const std::vector<std::string> run = with(tiny_cp_run(ModelStyle::llama, kIterations), {"--qk-layernorm"});
  const TrainingSummary want = run_f64(ParallelContext::single_process(), run);
  const ParallelState st = make_state({.cp = world}, 60);
  const TrainingSummary s = run_f64(st.ctx, with(run, {"--context-parallel-size", std::to_string(world)}));
  expect_same_run(want, s, 200 * 0x1p-53, "LLaMA qk-layernorm CP=" + std::to_string(world), st.ctx.world->rank() == 0);
}

// The weights and optimizer state of CP ranks are replicas, saved once (from DP x CP rank 0); the
// checkpoint does not depend on CP, so one rank resumes it.
TEST(CpCheckpoint, SavedAtCp2ResumesAtCp1) {
  const double tolerance = 200 * 0x1p-24;
  const ModelStyle style = ModelStyle::llama;
  const TrainingSummary straight = train_single_rank(tiny_cp_run(style, kIterations));
  std::unique_ptr<TempDir> owner;
  std::string dir;
  {
    const ParallelState st = make_state({.cp = 2}, 60);
    if (st.ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
    dir = shared_directory(owner.get());
    const TrainingSummary first = train_on(
        st.ctx,
        with(tiny_cp_run(style, 5), {"--context-parallel-size", "2", "--save", dir + "/cp2", "--save-interval", "5"}));
    const std::vector<double> straight_5(straight.train_losses.begin(), straight.train_losses.begin() + 5);
    expect_close(straight_5, first.train_losses, 0, tolerance, "CP=2 loss");
    st.ctx.world->barrier();
  }
  const TrainingSummary at_one = train_single_rank(with(tiny_cp_run(style, kIterations), {"--load", dir + "/cp2"}));
  expect_same_curve(straight, at_one, 5, tolerance, true, "CP=2 -> CP=1");
  make_state({}).ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
