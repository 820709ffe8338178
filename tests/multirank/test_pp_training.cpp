// multirank-np: 2 4
// Pipeline parallelism in `megatron train`'s own loop (1F1B over the stages, the loss from the
// last stage, the tied embedding's gradients summed over the embedding group, the gradient norm
// over TP x PP with the tied copy counted once, validation forward-only) trains the single-rank
// model. GPT-2 style (tied embeddings) and LLaMA style (untied), dropout on, 4 layers, 10
// iterations with a validation at 10, in f64:
//   2 ranks: PP=2 (both styles), PP=2 split unevenly (1 + 3 layers, LLaMA), PP=2 with full
//            activation recomputation (GPT), and PP=2 with two virtual stages per rank, the
//            interleaved schedule (both styles; the tied copies on rank 0's first chunk and rank
//            1's last), its sends and receives overlapped with compute (Megatron's default), also
//            in groups of 4 micro-batches (larger than the pipeline: only overlapped p2p runs
//            them), and blocking (--no-overlap-p2p-communication);
//   4 ranks: PP=4 (both styles; ranks 1 and 2 read no data), TP=2 x PP=2 with sequence
//            parallelism (LLaMA; also with full and with selective recomputation, whose reruns
//            repeat the SP gathers), PP=2 x DP=2 with the distributed optimizer (GPT), and the
//            same interleaved (PP=2 x V=2 x DP=2; GPT, and LLaMA with the gradient reduction and
//            the parameter gather overlapped in buckets of 2000 elements, 7 over the two chunks),
//            and GPT (tied) with the distributed optimizer and the reduction overlapped: PP=2 x DP=2
//            in small buckets with the gather overlapped too, and interleaved in Megatron's default
//            buckets (each chunk's own, the tied embedding alone).
// OverlapIsBitIdentical: overlapped p2p (also in groups of 4) and the overlapped reduction
// reproduce the blocking runs bit for bit, and the collective ledger shows the reduction starting
// before the last gradient arrives.
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
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "megatron/datasets/indexed_dataset.h"
#include "megatron/parallel/watchdog.h"
#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

constexpr int64_t kIterations = 10;

// A layout of the world and the model style it trains.
struct Layout {
  std::string name;
  ModelStyle style;
  ParallelSizes sizes;
  std::vector<std::string> flags;
};

// Two model chunks of one layer per rank: virtual stages 0 and 2 on rank 0, 1 and 3 on rank 1.
const std::vector<std::string> interleaved = {"--pipeline-model-parallel-size", "2",
                                              "--num-virtual-stages-per-pipeline-rank", "2"};
// All 4 micro-batches of a step (2 ranks) in one group, larger than the pipeline.
const std::vector<std::string> groups_of_4 = {"--microbatch-group-size-per-virtual-pipeline-stage", "4"};
const std::vector<std::string> dist_opt_overlapped = {"--use-distributed-optimizer", "--overlap-grad-reduce"};

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
            {"PP=2 x V=2", llama, {.pp = 2}, interleaved},
            {"PP=2 x V=2 groups of 4", gpt, {.pp = 2}, with(interleaved, groups_of_4)},
            {"PP=2 x V=2 groups of 4", llama, {.pp = 2}, with(interleaved, groups_of_4)},
            {"PP=2 x V=2 blocking p2p", gpt, {.pp = 2}, with(interleaved, {"--no-overlap-p2p-communication"})}};
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
                          "--ddp-bucket-size", "2000"})},
      {"PP=2 x DP=2 distributed optimizer, overlapped reduce and gather, small buckets",
       gpt,
       {.pp = 2},
       with({"--pipeline-model-parallel-size", "2", "--overlap-param-gather", "--ddp-bucket-size", "2000"},
            dist_opt_overlapped)},
      {"PP=2 x V=2 x DP=2 distributed optimizer, overlapped reduce",
       gpt,
       {.pp = 2},
       with(interleaved, dist_opt_overlapped)}};
}

TEST(PpTraining, EveryLayoutFollowsTheSingleRank) {
  const int world = int(make_state({}).ctx.world->size());
  const double tolerance = 200 * 0x1p-53;
  std::map<ModelStyle, TrainingSummary> single;
  for (ModelStyle style : {ModelStyle::gpt, ModelStyle::llama}) {
    single[style] = run_f64(ParallelContext::single_process(), tiny_pp_run(style, kIterations));
    ASSERT_EQ(single[style].valid_losses.size(), 1u);
  }
  for (const Layout& l : layouts(world)) {
    const ParallelState st = make_state(l.sizes, 60);
    const std::string what = std::string(style_name(l.style)) + " " + l.name;
    const TrainingSummary& want = single[l.style];
    const TrainingSummary s = run_f64(st.ctx, with(tiny_pp_run(l.style, kIterations), l.flags));
    expect_same_run(want, s, tolerance, what, st.ctx.world->rank() == 0);
  }
}

// The same run twice, one layout blocking and one overlapped; the curves must agree exactly (the
// overlap moves when tensors travel and reductions start, never what is summed in which order).
struct OverlapPair {
  std::string name;
  ModelStyle style;
  ParallelSizes sizes;
  std::vector<std::string> blocking, overlapped;
  std::string reduction_group;  // the ledger's DP reductions to see start before the last gradient
};

// Whether this rank's ledger shows a reduce-scatter or all-reduce on `group` issued between its
// first and its last pipeline gradient transfer, i.e. during the backwards (a one-iteration run:
// set-up comes before, logging and validation after).
bool reduction_starts_before_the_last_gradient(const CollectiveLog& log, const std::string& group) {
  const std::vector<CollectiveRecord> records = log.recent(SIZE_MAX);
  uint64_t first_gradient = UINT64_MAX, last_gradient = 0;
  for (const CollectiveRecord& r : records)
    if (r.group == "pp_grads" || r.group == "pp_grad") {
      first_gradient = std::min(first_gradient, r.id);
      last_gradient = std::max(last_gradient, r.id);
    }
  for (const CollectiveRecord& r : records)
    if (r.id > first_gradient && r.id < last_gradient && r.group.find(group) != std::string::npos &&
        (r.op.starts_with("reduce_scatter") || r.op.starts_with("all_reduce")))
      return true;
  return false;
}

TEST(PpTraining, OverlapIsBitIdentical) {
  using enum ModelStyle;
  const int world = int(make_state({}).ctx.world->size());
  std::vector<OverlapPair> pairs;
  const std::vector<std::string> blocking = with(interleaved, {"--no-overlap-p2p-communication"});
  if (world == 2) {
    pairs = {{"PP=2 x V=2 p2p", gpt, {.pp = 2}, blocking, interleaved, ""},
             {"PP=2 x V=2 p2p", llama, {.pp = 2}, blocking, interleaved, ""},
             {"PP=2 x V=2 p2p in groups of 4", gpt, {.pp = 2}, blocking, with(interleaved, groups_of_4), ""}};
  } else {
    pairs = {{"PP=2 x V=2 x DP=2 distributed optimizer reduction",
              gpt,
              {.pp = 2},
              with(interleaved, {"--use-distributed-optimizer"}),
              with(interleaved, dist_opt_overlapped),
              "dp"}};
  }
  for (const OverlapPair& pair : pairs) {
    const std::string what = std::string(style_name(pair.style)) + " " + pair.name;
    TrainingSummary runs[2];
    bool early[2] = {false, false};
    for (int overlapped = 0; overlapped < 2; ++overlapped) {
      ParallelOptions options;
      options.timeout_seconds = 60;
      options.pipeline_channels = true;
      options.log_capacity = 1 << 16;  // every record of the runs below
      options.mpi = mpi_runtime();
      const std::vector<std::string>& flags = overlapped ? pair.overlapped : pair.blocking;
      {
        const ParallelState st = initialize_parallel(pair.sizes, options);
        runs[overlapped] = run_f64(st.ctx, with(tiny_pp_run(pair.style, kIterations), flags));
      }
      if (pair.reduction_group.empty()) continue;
      const ParallelState one = initialize_parallel(pair.sizes, options);
      run_f64(one.ctx, with(tiny_pp_run(pair.style, 1), flags));
      early[overlapped] = reduction_starts_before_the_last_gradient(one.watchdog->log(), pair.reduction_group);
    }
    EXPECT_EQ(runs[0].train_losses, runs[1].train_losses) << what;
    EXPECT_EQ(runs[0].grad_norms, runs[1].grad_norms) << what;
    EXPECT_EQ(runs[0].valid_losses, runs[1].valid_losses) << what;
    if (!pair.reduction_group.empty()) {
      // Blocking, every bucket waits for finalize_model_grads, after the last backward.
      EXPECT_FALSE(early[0]) << what << ": a reduction started during backward without --overlap-grad-reduce";
      EXPECT_TRUE(early[1]) << what << ": no bucket started reducing before the last gradient arrived";
    }
  }
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
  const int rank = int(make_state({}).ctx.world->rank());
  std::vector<std::string> run = tiny_pp_run(ModelStyle::llama, kIterations);
  std::erase(run, std::string("--mock-data"));
  run = with(run, {"--data-path", dir + "/docs", "--split", "90,10,0", "--reset-attention-mask"});
  // Every rank runs the single-rank references, each with an index cache of its own.
  const std::vector<std::string> single = with(run, {"--data-cache-path", dir + "/cache" + std::to_string(rank)});
  std::vector<std::string> unmasked = single;
  std::erase(unmasked, std::string("--reset-attention-mask"));
  const TrainingSummary want = run_f64(ParallelContext::single_process(), single);
  EXPECT_NE(run_f64(ParallelContext::single_process(), unmasked).train_losses.front(), want.train_losses.front())
      << "document masking changes nothing on these data";
  const ParallelState st = make_state({.pp = 4}, 60);
  const TrainingSummary s =
      run_f64(st.ctx, with(run, {"--pipeline-model-parallel-size", "4", "--data-cache-path", dir + "/cache"}));
  expect_same_curve(want, s, 0, 200 * 0x1p-53, /*compare_grad_norm=*/true, "PP=4 document masking");
  expect_close(want.valid_losses, s.valid_losses, 0, 200 * 0x1p-53, "PP=4 document masking validation loss");
  st.ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
