// multirank-np: 2 4
// Megatron FSDP's memory per rank against the replicated run's (plain DDP), fp32, GPT-2 style, 12
// layers of hidden 64, DP = the world, 2 iterations, each strategy: between steps the weights,
// gradients and optimizer state a rank holds (the buffers' bytes as DistributedDataParallel and
// the optimizer count them: TrainingSummary) are each within [1/DP, 1.05/DP] of replicated for
// what the strategy shards and whole for the rest (the 5% covers the buckets' padding to
// lcm(DP, 128) elements: below 0.5% here, every parameter being a multiple of 64 elements). At
// their peak FSDP adds the buckets in use: at most three gathered (the module running, the one
// prefetched, and in backward the tied embedding's, open until its gradient is final) and for
// gradients at most four full buckets with their reduced parts (the one computing, two reductions
// in flight, the embedding's). A bucket is at most one layer here. The fractions are printed.
#include <cstdio>
#include <string>
#include <vector>

#include "multirank/fsdp_training_util.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

// What a rank holds, as fractions of the replicated run's.
struct Held {
  double weights, weights_peak, grads, grads_peak, optimizer;
};

TEST(FsdpMemory, ShardedStateIsAboutOneOverDpOfReplicated) {
  const ParallelState st = make_state({}, 60);
  const int dp = st.ctx.world->size();
  std::vector<std::string> argv = fsdp_run(ModelStyle::gpt, 2);
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--num-layers") argv[i + 1] = "12";
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
      std::printf(
          "DP %d %s, per rank / replicated (%lld weight, %lld gradient, %lld optimizer bytes): weights %.3f "
          "(peak %.3f), gradients %.3f (peak %.3f), optimizer state %.3f\n",
          dp, strategy, static_cast<long long>(replicated.weight_bytes), static_cast<long long>(replicated.grad_bytes),
          static_cast<long long>(replicated.optimizer_state_bytes), held.weights, held.weights_peak, held.grads,
          held.grads_peak, held.optimizer);
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

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
