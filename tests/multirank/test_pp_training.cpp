// multirank-np: 2 4
// Pipeline parallelism in `megatron train`'s own loop (1F1B over the stages, the loss from the
// last stage, the tied embedding's gradients summed over the embedding group, the gradient norm
// over TP x PP with the tied copy counted once, validation forward-only) trains the single-rank
// model. GPT-2 style (tied embeddings) and LLaMA style (untied), dropout on, 4 layers, 10
// iterations with a validation at 10, in f64:
//   2 ranks: PP=2 (both styles), PP=2 split unevenly (1 + 3 layers, LLaMA), PP=2 with full
//            activation recomputation (GPT), and PP=2 with two virtual stages per rank, the
//            interleaved schedule (both styles; the tied copies on rank 0's first chunk and rank
//            1's last);
//   4 ranks: PP=4 (both styles; ranks 1 and 2 read no data), TP=2 x PP=2 with sequence
//            parallelism (LLaMA; also with full and with selective recomputation, whose reruns
//            repeat the SP gathers), PP=2 x DP=2 with the distributed optimizer (GPT), and the
//            same interleaved (PP=2 x V=2 x DP=2; GPT, and LLaMA with the gradient reduction and
//            the parameter gather overlapped in buckets of 2000 elements, 7 over the two chunks).
// (Interleaved runs overlap their p2p, Megatron's default; test_pp_overlap.cpp compares it with the
// blocking batches and covers overlapped gradient reduction with tied embeddings.)
// Then a checkpoint (fp32, GPT): PP=2 (x DP=2 on 4 ranks) saves at iteration 5; PP=1 and
// (4 ranks) PP=4 resume it on the same curve: layers are saved under their global numbers, the
// tied copy once. A checkpoint saved interleaved (PP=2 x V=2) resumes at PP=1 and at PP=2 without
// interleaving. Document masking at PP=4 (4 ranks): the middle stages, which otherwise read no
// data, read the segment ids their attention needs.
//
// Tolerance 200 u relative (u = 2^-53 in f64, 2^-24 in fp32), as the TP tests: the layouts compute
// the same sums in another order (the grad norm's squares summed per stage, then over the stages;
// TP's partial products; DP's micro-batch order), each regrouping moving a result by a few u. A
// defect (a stage that misses its input, a tied copy left unsummed or counted twice in the norm)
// moves the curve by 1e-3 or more.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "megatron/datasets/indexed_dataset.h"
#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

constexpr int64_t kIterations = 10;

using Layout = PpLayout;
const std::vector<std::string> interleaved = pp2_interleaved_flags();

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
              "--recompute-num-layers", "1"}},
            {"PP=2 x V=2", gpt, {.pp = 2}, interleaved},
            {"PP=2 x V=2", llama, {.pp = 2}, interleaved}};
  return {
      {"PP=4", gpt, {.pp = 4}, {"--pipeline-model-parallel-size", "4"}},
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
       {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}},
      {"PP=2 x V=2 x DP=2 distributed optimizer", gpt, {.pp = 2}, with(interleaved, {"--use-distributed-optimizer"})},
      {"PP=2 x V=2 x DP=2 distributed optimizer, overlapped reduce and gather, small buckets",
       llama,
       {.pp = 2},
       with(interleaved, {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                          "--ddp-bucket-size", "2000"})}};
}

TEST(PpTraining, EveryLayoutFollowsTheSingleRank) {
  expect_pp_layouts_follow_the_single_rank(layouts(int(make_state({}).ctx.world->size())), kIterations, 200 * 0x1p-53);
}

// GPT-2 style (the tied embedding saved once, from the first stage, and read by both ends): a
// checkpoint saved at iteration 5 by the PP=2 layout `save_flags` resumes in each of `resumes` (no
// flags: one rank) on the single-rank curve.
void expect_resumed_on_the_curve(const std::string& saved, const std::vector<std::string>& save_flags,
                                 const std::vector<Layout>& resumes) {
  const double tolerance = 200 * 0x1p-24;
  const ModelStyle style = ModelStyle::gpt;
  const TrainingSummary straight = train_single_rank(tiny_pp_run(style, kIterations));
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get()) + "/checkpoints";
  {
    const ParallelState st = make_state({.pp = 2}, 60);
    const TrainingSummary first =
        train_on(st.ctx, with(tiny_pp_run(style, 5), with(save_flags, {"--save", dir, "--save-interval", "5"})));
    const std::vector<double> straight_5(straight.train_losses.begin(), straight.train_losses.begin() + 5);
    expect_close(straight_5, first.train_losses, 0, tolerance, saved + " loss");
    st.ctx.world->barrier();
  }
  for (const Layout& l : resumes) {
    const std::vector<std::string> argv = with(tiny_pp_run(style, kIterations), with(l.flags, {"--load", dir}));
    const std::string what = saved + " -> " + l.name;
    if (l.flags.empty()) {
      expect_same_curve(straight, train_single_rank(argv), 5, tolerance, true, what);
      continue;
    }
    const ParallelState st = make_state(l.sizes, 60);
    expect_same_curve(straight, train_on(st.ctx, argv), 5, tolerance, true, what);
  }
  make_state({}).ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

TEST(PpCheckpoint, SavedAtPp2ResumesAtPp1AndPp4) {
  using enum ModelStyle;
  std::vector<Layout> resumes = {{"PP=1", gpt, {}, {}}};
  if (make_state({}).ctx.world->size() == 4)
    resumes.push_back({"PP=4", gpt, {.pp = 4}, {"--pipeline-model-parallel-size", "4"}});
  expect_resumed_on_the_curve("PP=2", {"--pipeline-model-parallel-size", "2"}, resumes);
}

// Each rank's two chunks save their layers under global numbers: PP=1 and PP=2 without
// interleaving (two layers per rank) read them.
TEST(PpCheckpoint, SavedInterleavedResumesAtPp1AndPp2) {
  using enum ModelStyle;
  expect_resumed_on_the_curve(
      "PP=2 x V=2", interleaved,
      {{"PP=1", gpt, {}, {}}, {"PP=2", gpt, {.pp = 2}, {"--pipeline-model-parallel-size", "2"}}});
}

// --reset-attention-mask on documents of 3 to 9 tokens (every sample spans several): PP=4's middle
// stages read the data for the segment ids alone, and the curve is the single rank's. The masked
// curve differs from the unmasked one, so a stage attending across documents would show.
TEST(PpData, DocumentMaskingReachesTheMiddleStages) {
  if (make_state({}).ctx.world->size() != 4) GTEST_SKIP() << "PP=4 has middle stages";
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) {
    owner = std::make_unique<TempDir>();
    datasets::IndexedDatasetBuilder builder(owner->path() + "/docs", datasets::IndexDType::u16);
    for (int d = 0; d < 200; ++d) {
      std::vector<int32_t> ids;
      for (int t = 0; t < 2 + d % 7; ++t) ids.push_back((d * 7 + t * 3) % 99);
      ids.push_back(99);  // NullTokenizer's EOD: the vocabulary's last id
      builder.add_document(ids);
    }
    builder.finalize();
  }
  const std::string dir = shared_directory(owner.get());
  std::vector<std::string> run = tiny_pp_run(ModelStyle::llama, kIterations);
  std::erase(run, std::string("--mock-data"));
  run = with(run, {"--data-path", dir + "/docs", "--split", "90,10,0", "--reset-attention-mask"});
  // Every rank runs the single-rank references; each process has an index cache of its own
  // (tiny_model_run's mock_index_cache, which serves these data as well).
  std::vector<std::string> unmasked = run;
  std::erase(unmasked, std::string("--reset-attention-mask"));
  const TrainingSummary want = run_f64(ParallelContext::single_process(), run);
  EXPECT_NE(run_f64(ParallelContext::single_process(), unmasked).train_losses.front(), want.train_losses.front())
      << "document masking changes nothing on these data";
  const ParallelState st = make_state({.pp = 4}, 60);
  const TrainingSummary s = run_f64(st.ctx, with(run, {"--pipeline-model-parallel-size", "4"}));
  expect_same_curve(want, s, 0, 200 * 0x1p-53, /*compare_grad_norm=*/true, "PP=4 document masking");
  expect_close(want.valid_losses, s.valid_losses, 0, 200 * 0x1p-53, "PP=4 document masking validation loss");
  st.ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
