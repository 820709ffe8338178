// multirank-np: 2 4
// Pipeline parallelism in `megatron train`'s own loop (1F1B over the stages, the loss from the
// last stage, the tied embedding's gradients summed over the embedding group, the gradient norm
// over TP x PP with the tied copy counted once, validation forward-only) trains the single-rank
// model. GPT-2 style (tied embeddings) and LLaMA style (untied), dropout on, 4 layers, 10
// iterations with a validation at 10, in f64:
//   2 ranks: PP=2 (both styles), and PP=2 split unevenly (1 + 3 layers, LLaMA), PP=2 with full
//            activation recomputation (GPT);
//   4 ranks: PP=4 (both styles), TP=2 x PP=2 with sequence parallelism (LLaMA; also with full and
//            with selective recomputation, whose reruns repeat the SP gathers), PP=2 x DP=2 with
//            the distributed optimizer (GPT).
// Then a checkpoint (fp32, GPT): PP=2 (x DP=2 on 4 ranks) saves at iteration 5; PP=1 and
// (4 ranks) PP=4 resume it on the same curve: layers are saved under their global numbers, the
// tied copy once.
//
// Tolerance 200 u relative (u = 2^-53 in f64, 2^-24 in fp32), as the TP tests: the layouts compute
// the same sums in another order (the grad norm's squares summed per stage, then over the stages;
// TP's partial products; DP's micro-batch order), each regrouping moving a result by a few u. A
// defect (a stage that misses its input, a tied copy left unsummed or counted twice in the norm)
// moves the curve by 1e-3 or more.
#include <algorithm>
#include <cstdio>
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

TrainingSummary run(const ParallelContext& ctx, const std::vector<std::string>& argv, DType dtype) {
  TrainingArgs args = parse_training_args(argv, ctx.world->size());
  args.model.params_dtype = dtype;  // f64 has no flag: it exists for checks like this one
  return pretrain(args, ctx, Device::cpu());
}

// A layout of the world and the model style it trains.
struct Layout {
  std::string name;
  ModelStyle style;
  ParallelSizes sizes;
  std::vector<std::string> flags;
};

std::vector<Layout> layouts(int world) {
  using enum ModelStyle;
  if (world == 2)
    return {{"PP=2", gpt, {.pp = 2}, {"--pipeline-model-parallel-size", "2"}},
            {"PP=2", llama, {.pp = 2}, {"--pipeline-model-parallel-size", "2"}},
            {"PP=2 uneven 1+3",
             llama,
             {.pp = 2},
             {"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"}},
            {"PP=2 full recompute uniform 1",
             gpt,
             {.pp = 2},
             {"--pipeline-model-parallel-size", "2", "--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", "1"}}};
  return {{"PP=4", gpt, {.pp = 4}, {"--pipeline-model-parallel-size", "4"}},
          {"PP=4", llama, {.pp = 4}, {"--pipeline-model-parallel-size", "4"}},
          {"TP=2 x PP=2 SP",
           llama,
           {.tp = 2, .pp = 2},
           {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"}},
          {"TP=2 x PP=2 SP full recompute block 1",
           llama,
           {.tp = 2, .pp = 2},
           {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"}},
          {"TP=2 x PP=2 SP selective recompute core_attn mlp",
           llama,
           {.tp = 2, .pp = 2},
           {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"}},
          {"PP=2 x DP=2 distributed optimizer",
           gpt,
           {.pp = 2},
           {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}}};
}

TEST(PpTraining, EveryLayoutFollowsTheSingleRank) {
  const int world = int(make_state({}).ctx.world->size());
  const double tolerance = 200 * 0x1p-53;
  std::map<ModelStyle, TrainingSummary> single;
  for (ModelStyle style : {ModelStyle::gpt, ModelStyle::llama}) {
    single[style] = run(ParallelContext::single_process(), tiny_pp_run(style, kIterations), DType::f64);
    ASSERT_EQ(single[style].valid_losses.size(), 1u);
  }
  for (const Layout& l : layouts(world)) {
    const ParallelState st = make_state(l.sizes, 60);
    const std::string what = std::string(style_name(l.style)) + " " + l.name;
    const TrainingSummary& want = single[l.style];
    const TrainingSummary s = run(st.ctx, with(tiny_pp_run(l.style, kIterations), l.flags), DType::f64);
    double worst = expect_same_curve(want, s, 0, tolerance, /*compare_grad_norm=*/true, what);
    worst = std::max(worst, expect_close(want.valid_losses, s.valid_losses, 0, tolerance, what + " validation loss"));
    worst = std::max(worst, expect_close({*want.end_valid_loss}, {*s.end_valid_loss}, 0, tolerance,
                                         what + " final validation loss"));
    if (st.ctx.world->rank() == 0)
      std::printf("%s: largest deviation %.1f u of the 200 u allowed\n", what.c_str(), worst / 0x1p-53);
  }
}

// GPT-2 style, whose tied embedding is saved once (from the first stage) and read by both ends.
TEST(PpCheckpoint, SavedAtPp2ResumesAtPp1AndPp4) {
  const int world = int(make_state({}).ctx.world->size());
  const double tolerance = 200 * 0x1p-24;
  const ModelStyle style = ModelStyle::gpt;
  const TrainingSummary straight = train_single_rank(tiny_pp_run(style, kIterations));
  std::unique_ptr<TempDir> owner;
  std::string dir;
  {
    const ParallelState st = make_state({.pp = 2}, 60);
    if (st.ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
    dir = shared_directory(owner.get());
    const TrainingSummary first =
        train_on(st.ctx, with(tiny_pp_run(style, 5),
                              {"--pipeline-model-parallel-size", "2", "--save", dir + "/pp2", "--save-interval", "5"}));
    const std::vector<double> straight_5(straight.train_losses.begin(), straight.train_losses.begin() + 5);
    expect_close(straight_5, first.train_losses, 0, tolerance, "PP=2 loss");
    st.ctx.world->barrier();
  }
  const TrainingSummary at_one = train_single_rank(with(tiny_pp_run(style, kIterations), {"--load", dir + "/pp2"}));
  expect_same_curve(straight, at_one, 5, tolerance, true, "PP=2 -> PP=1");
  if (world == 4) {
    const ParallelState st = make_state({.pp = 4}, 60);
    const TrainingSummary at_four = train_on(
        st.ctx, with(tiny_pp_run(style, kIterations), {"--pipeline-model-parallel-size", "4", "--load", dir + "/pp2"}));
    expect_same_curve(straight, at_four, 5, tolerance, true, "PP=2 -> PP=4");
  }
  make_state({}).ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
