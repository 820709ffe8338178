// multirank-np: 2 4
// Megatron FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy S) trains the single-rank
// model, holds about 1/DP of the replicated state, and its checkpoints reshard.
//
// Curves, in f64, DP = the world (2 or 4; 8 sequences per batch, so 4 or 2 micro-batches per rank
// and the gradients of each module are reduce-scattered once per micro-batch): every strategy,
// GPT-2 style (tied embeddings: the word embedding is gathered again for the output layer and its
// bucket stays open through backward) and LLaMA style (untied, SwiGLU, GQA), dropout on;
// optim_grads_params also under full recomputation (the rerun gathers its segment before the
// backward) and with --overlap-grad-reduce --overlap-param-gather; on 4 ranks TP=2 x DP=2 with
// and without sequence parallelism (the SP gradients summed over TP on the owned ranges).
// Tolerance 200 u relative (u = 2^-53), as the TP and PP tests: a layout sums the same terms in
// another order (the 1/DP-scaled reduce-scatter per micro-batch, then the accumulation into the
// shard; each regrouping moves a result by a few u). A defect (a gradient dropped, a stale gathered
// bucket, a shard added twice) moves the curve by 1e-3 or more. bf16 with optim_grads_params
// (fp32 masters writing the bf16 shards) is held to 1e-3 as test_dp_training's bf16 runs.
//
// Memory (fp32, 16 layers of hidden 64, DP = the world): between steps the weights, gradients and
// optimizer state a rank holds are each within [1/DP, 1.05/DP] of the replicated run's, for what
// the strategy shards (the 5% covers the buckets' padding to lcm(DP, 128) elements: below 0.5%
// here, every parameter being a multiple of 64 elements). At their peak, FSDP adds the buckets
// in use: at most three gathered (the module running, the one prefetched, and in backward the
// tied embedding's, open until its gradient is final) and, for gradients, at most four full
// buckets with their reduced parts (the one computing, two reductions in flight, the embedding's).
// A bucket is at most one layer here. The numbers are printed.
//
// Checkpoints (fp32 and bf16, GPT): saved with optim_grads_params at DP = the world, resumed on one
// process without FSDP, at DP = the world with optim_grads and (4 ranks) at TP=2 x DP=2 with
// optim_grads_params; saved on one process without FSDP and resumed with optim_grads_params; each
// on the uninterrupted curve within 200 fp32 u (1e-3 in bf16).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

constexpr int64_t kIterations = 20;

std::vector<std::string> fsdp_flags(const std::string& strategy) {
  std::vector<std::string> f = {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy};
  if (strategy != "no_shard") f.push_back("--use-distributed-optimizer");
  return f;
}

// tiny_tp_run with 8 sequences per global batch: several micro-batches per rank at DP 2 and 4.
std::vector<std::string> fsdp_run(ModelStyle style, int64_t iters) {
  std::vector<std::string> argv = tiny_tp_run(style, iters);
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--global-batch-size") argv[i + 1] = "8";
  return argv;
}

std::string name_of(ModelStyle style, int dp, const std::vector<std::string>& flags) {
  std::string name = std::string(style_name(style)) + " DP " + std::to_string(dp);
  for (const std::string& f : flags) name += " " + f;
  return name;
}

TEST(FsdpTraining, EveryStrategyFollowsTheSingleRank) {
  const ParallelState st = make_state({}, 60);
  const int dp = st.ctx.world->size();
  const bool print = st.ctx.world->rank() == 0;
  const double tolerance = 200 * 0x1p-53;
  for (const ModelStyle style : {ModelStyle::gpt, ModelStyle::llama}) {
    const TrainingSummary single = run_f64(ParallelContext::single_process(), fsdp_run(style, kIterations));
    std::vector<std::vector<std::string>> layouts;
    for (const char* strategy : {"no_shard", "optim", "optim_grads", "optim_grads_params"})
      layouts.push_back(fsdp_flags(strategy));
    layouts.push_back(with(fsdp_flags("optim_grads_params"), {"--overlap-grad-reduce", "--overlap-param-gather"}));
    if (style == ModelStyle::gpt)
      layouts.push_back(with(fsdp_flags("optim_grads_params"), {"--recompute-granularity", "full", "--recompute-method",
                                                                "uniform", "--recompute-num-layers", "1"}));
    for (const auto& flags : layouts) {
      const std::string what = name_of(style, dp, flags);
      const TrainingSummary s = run_f64(st.ctx, with(fsdp_run(style, kIterations), flags));
      expect_same_run(single, s, tolerance, what, print);
    }
  }
  // bf16: the shards hold the compute copy the fp32 masters write (tolerance in the header).
  const std::vector<std::string> bf16 = with(fsdp_run(ModelStyle::llama, kIterations), {"--bf16"});
  const TrainingSummary single = train_single_rank(bf16);
  const TrainingSummary s = train_on(st.ctx, with(bf16, fsdp_flags("optim_grads_params")));
  expect_same_curve(single, s, 0, 1e-3, /*compare_grad_norm=*/false, "bf16 optim_grads_params");
}

TEST(FsdpTraining, TensorTimesDataParallelFollowsTheSingleRank) {
  if (make_state({}).ctx.world->size() != 4) GTEST_SKIP() << "TP=2 x DP=2 needs 4 ranks";
  const ParallelState st = make_state({.tp = 2}, 60);
  const bool print = st.ctx.world->rank() == 0;
  for (const ModelStyle style : {ModelStyle::gpt, ModelStyle::llama}) {
    const TrainingSummary single = run_f64(ParallelContext::single_process(), fsdp_run(style, kIterations));
    for (const char* strategy : {"optim_grads", "optim_grads_params"})
      for (const bool sp : {false, true}) {
        std::vector<std::string> flags = with(fsdp_flags(strategy), {"--tensor-model-parallel-size", "2"});
        if (sp) flags.push_back("--sequence-parallel");
        const TrainingSummary s = run_f64(st.ctx, with(fsdp_run(style, kIterations), flags));
        expect_same_run(single, s, 200 * 0x1p-53, "TP 2 x " + name_of(style, 2, flags), print);
      }
  }
}

// What a rank holds, as fractions of the replicated run's.
struct Held {
  double weights, weights_peak, grads, grads_peak, optimizer;
};

TEST(FsdpTraining, ShardedStateIsAboutOneOverDpOfReplicated) {
  const ParallelState st = make_state({}, 60);
  const int dp = st.ctx.world->size();
  std::vector<std::string> argv = fsdp_run(ModelStyle::gpt, 3);
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--num-layers") argv[i + 1] = "16";
    if (argv[i] == "--hidden-size") argv[i + 1] = "64";
  }
  // One layer (GPT style, hidden 64, FFN 256): QKV 64x192 + 192, projection 64x64 + 64, fc1 64x256 +
  // 256, fc2 256x64 + 64, two LayerNorms 2 x (64 + 64); fp32. The largest bucket.
  const double layer_bytes = 4.0 * (64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64 + 4 * 64);
  const TrainingSummary replicated = train_on(st.ctx, argv);  // plain DDP: everything whole
  const auto fraction = [&](int64_t bytes, int64_t of) { return double(bytes) / double(of); };
  for (const char* strategy : {"optim", "optim_grads", "optim_grads_params"}) {
    const TrainingSummary s = train_on(st.ctx, with(argv, fsdp_flags(strategy)));
    const Held held{fraction(s.weight_bytes, replicated.weight_bytes),
                    fraction(s.peak_weight_bytes, replicated.weight_bytes),
                    fraction(s.grad_bytes, replicated.grad_bytes), fraction(s.peak_grad_bytes, replicated.grad_bytes),
                    fraction(s.optimizer_state_bytes, replicated.optimizer_state_bytes)};
    if (st.ctx.world->rank() == 0)
      std::printf("DP %d %s, per rank / replicated (%lld weight, %lld gradient, %lld optimizer bytes): weights %.3f "
                  "(peak %.3f), gradients %.3f (peak %.3f), optimizer state %.3f\n",
                  dp, strategy, static_cast<long long>(replicated.weight_bytes),
                  static_cast<long long>(replicated.grad_bytes),
                  static_cast<long long>(replicated.optimizer_state_bytes), held.weights, held.weights_peak,
                  held.grads, held.grads_peak, held.optimizer);
    const std::string shard = std::string(strategy);
    const auto expect_sharded = [&](double f, const char* what) {
      EXPECT_GE(f, 1.0 / dp) << shard << " " << what;
      EXPECT_LE(f, 1.05 / dp) << shard << " " << what;
    };
    expect_sharded(held.optimizer, "optimizer state");
    if (shard == "optim") {
      EXPECT_NEAR(held.grads, 1.0, 0.05) << "optim keeps whole gradients";
      EXPECT_NEAR(held.weights, 1.0, 0.05) << "optim keeps whole weights";
      continue;
    }
    expect_sharded(held.grads, "gradients between steps");
    EXPECT_LE(double(s.peak_grad_bytes - s.grad_bytes), 4 * layer_bytes * (1.0 + 1.0 / dp)) << shard;
    if (shard == "optim_grads") {
      EXPECT_NEAR(held.weights, 1.0, 0.05) << "optim_grads keeps whole weights";
      continue;
    }
    expect_sharded(held.weights, "weights between steps");
    EXPECT_LE(double(s.peak_weight_bytes - s.weight_bytes), 3 * layer_bytes) << shard;
    EXPECT_GT(s.peak_weight_bytes, s.weight_bytes) << "the forward gathers whole buckets";
  }
}

// fp32 and bf16, GPT style (tolerances in the header).
TEST(FsdpCheckpoint, ReshardsToAndFromOtherLayouts) {
  const ParallelState st = make_state({}, 60);
  Communicator& world = *st.ctx.world;
  const int rank = world.rank();
  const std::unique_ptr<TempDir> owner = rank == 0 ? std::make_unique<TempDir>() : nullptr;
  const std::string dir = shared_directory(owner.get());
  for (const bool bf16 : {false, true}) {
    const std::vector<std::string> run = with(fsdp_run(ModelStyle::gpt, kIterations),
                                              bf16 ? std::vector<std::string>{"--bf16"} : std::vector<std::string>{});
    const std::vector<std::string> run10 = with(fsdp_run(ModelStyle::gpt, 10),
                                                bf16 ? std::vector<std::string>{"--bf16"} : std::vector<std::string>{});
    const double tolerance = bf16 ? 1e-3 : 200 * 0x1p-24;
    const std::string kind = bf16 ? " (bf16)" : " (fp32)";
    const TrainingSummary straight = train_single_rank(run);

    const std::string zero3 = dir + (bf16 ? "/zero3_bf16" : "/zero3");
    train_on(st.ctx, with(run10, with(fsdp_flags("optim_grads_params"), {"--save", zero3, "--save-interval", "10"})));
    world.barrier();
    const std::string from = "optim_grads_params DP " + std::to_string(world.size());
    expect_same_curve(straight, train_single_rank(with(run, {"--load", zero3})), 10, tolerance, !bf16,
                      from + " -> one rank without FSDP" + kind);
    expect_same_curve(straight, train_on(st.ctx, with(run, with(fsdp_flags("optim_grads"), {"--load", zero3}))), 10,
                      tolerance, !bf16, from + " -> optim_grads" + kind);
    if (world.size() == 4) {
      const ParallelState tp = make_state({.tp = 2}, 60);
      const std::vector<std::string> flags =
          with(fsdp_flags("optim_grads_params"), {"--tensor-model-parallel-size", "2", "--load", zero3});
      expect_same_curve(straight, train_on(tp.ctx, with(run, flags)), 10, tolerance, !bf16,
                        from + " -> TP 2 x DP 2 optim_grads_params" + kind);
    }

    const std::string plain = dir + (bf16 ? "/plain_bf16" : "/plain");
    if (rank == 0) train_single_rank(with(run10, {"--save", plain, "--save-interval", "10"}));
    world.barrier();
    expect_same_curve(straight,
                      train_on(st.ctx, with(run, with(fsdp_flags("optim_grads_params"), {"--load", plain}))), 10,
                      tolerance, !bf16, "one rank without FSDP -> optim_grads_params" + kind);
  }
  world.barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
