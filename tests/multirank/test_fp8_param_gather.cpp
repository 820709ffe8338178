// multirank-np: 2
// --fp8-param-gather (distributed/fp8_params.h) on CPU ranks, the FP8 GEMMs in the CPU backend's
// exact emulation, with `megatron train`'s own loop and the distributed optimizer, for the delayed
// (hybrid, a history of 4 steps and its max) and tensorwise (e4m3) recipes on the LLaMA-style tiny
// model:
//   - the weights of the FP8 layers are held as FP8 codes, every one of them the cast of its f32
//     masters at its layer's scale, and the parameter buffer shrinks by a byte per such weight;
//   - the single rank's run tracks the run that keeps those weights in bf16 (the same casts, of
//     the masters instead of their bf16 rounding);
//   - DP=2 (its gathers overlapped with the forward or not, bit for bit) and TP=2 with SP follow
//     the single rank's curve with the flag;
//   - saved and resumed at the same layout it continues bit for bit, a DP=2 checkpoint resumes
//     on one rank on the saving run's curve, and checkpoints cross between runs with and without
//     the flag.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "megatron/distributed/distributed_optimizer.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/optimizer/optimizer.h"
#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

enum class Recipe { delayed, tensorwise };
const char* recipe_name(Recipe r) { return r == Recipe::delayed ? "delayed" : "tensorwise"; }

std::vector<std::string> run_args(int64_t iters) {
  return with(tiny_tp_run(ModelStyle::llama, iters), {"--bf16", "--use-distributed-optimizer"});
}

// FP8 (and --fp8-param-gather with it) set after parsing: the CLI refuses --fp8-format without a GPU.
TrainingArgs fp8_args(const ParallelContext& ctx, const std::vector<std::string>& argv, Recipe recipe,
                      bool fp8_param_gather) {
  TrainingArgs args = parse_training_args(argv, ctx.world->size());
  Fp8Config& fp8 = args.model.fp8;
  fp8.fp8_param_gather = fp8_param_gather;
  if (recipe == Recipe::delayed) {
    fp8.fp8_format = "hybrid";
    fp8.fp8_amax_history_len = 4;
    fp8.fp8_amax_compute_algo = "max";
  } else {
    fp8.fp8_format = "e4m3";
    fp8.fp8_recipe = "tensorwise";
  }
  return args;
}

TrainingSummary train(const ParallelContext& ctx, const std::vector<std::string>& argv, Recipe recipe,
                      bool fp8_param_gather = true) {
  return pretrain(fp8_args(ctx, argv, recipe, fp8_param_gather), ctx, Device::cpu());
}

// The largest relative loss difference of b from a over iterations [first, a's end).
double worst_gap(const TrainingSummary& a, const TrainingSummary& b, size_t first, size_t offset_b = 0) {
  double worst = 0;
  for (size_t i = first; i < a.train_losses.size(); ++i)
    worst = std::max(worst, std::abs(b.train_losses.at(i - offset_b) / a.train_losses[i] - 1));
  return worst;
}

// The weights of a model built as `megatron train` builds it, one step trained: FP8 codes where
// they should be, each equal to its masters' cast.
void expect_weights_held_in_fp8(Recipe recipe) {
  const ParallelContext ctx = ParallelContext::single_process();
  const TrainingArgs args = fp8_args(ctx, run_args(1), recipe, true);
  TransformerConfig config = args.model;
  if (config.padded_vocab_size == 0) {  // the tokenizer's in `megatron train`: --vocab-size 100, padded to 128
    config.vocab_size = 100;
    config.padded_vocab_size = 128;
  }
  GPTModel model(config, ctx);
  model.parameters().initialize(7);
  DistributedDataParallel ddp(model.parameters(), ctx, {.use_distributed_optimizer = true});
  DistributedOptimizer optimizer(ddp, ctx, {});
  int64_t fp8_elements = 0, bf16_elements = 0;
  for (const auto& p : model.parameters().params()) {
    const bool fp8_layer_weight =
        p->spec.name.ends_with("linear_qkv.weight") || p->spec.name.ends_with("linear_proj.weight") ||
        p->spec.name.ends_with("linear_fc1.weight") || p->spec.name.ends_with("linear_fc2.weight");
    EXPECT_EQ(p->held_in_fp8(), fp8_layer_weight) << p->spec.name;
    EXPECT_EQ(p->data.dtype(), fp8_layer_weight ? DType::e4m3 : DType::bf16) << p->spec.name;
    (fp8_layer_weight ? fp8_elements : bf16_elements) += p->data.numel();
  }
  ASSERT_GT(fp8_elements, 0);
  int64_t bytes = 0;
  for (const Tensor& part : model.parameters().param_buffers()) bytes += int64_t(part.nbytes());
  // Each weight one byte where it was two, the buckets' padding aside (64-element alignment, 128-element buckets).
  EXPECT_LT(bytes, fp8_elements + 2 * bf16_elements + 4096) << "parameter buffer of " << bytes << " bytes";

  // Each FP8 weight is its f32 masters' cast at its layer's scale, byte for byte.
  const auto check = [&](const char* when) {
    const std::vector<checkpointing::ShardedTensor> state = optimizer.sharded_state(Optimizer::StateCopies::this_rank);
    for (const auto& p : model.parameters().params()) {
      if (!p->held_in_fp8()) continue;
      const auto master = std::find_if(state.begin(), state.end(), [&](const checkpointing::ShardedTensor& t) {
        return t.name == optimizer_state_name(p->spec.name, "fp32_param");
      });
      ASSERT_NE(master, state.end()) << p->spec.name;
      Tensor expected = Tensor::empty(p->local_shape, DType::e4m3), no_amax;
      ops::fp8_quantize(expected, no_amax, master->local.view(p->local_shape), p->fp8->scaling->scale);
      EXPECT_EQ(std::memcmp(expected.raw(), p->data.raw(), p->data.nbytes()), 0) << when << ": " << p->spec.name;
    }
  };
  check("after the first cast");
  const int64_t S = config.seq_length;
  Tensor tokens = Tensor::empty({1, S}, DType::i32), labels = Tensor::empty({1, S}, DType::i32);
  Tensor mask = Tensor::empty({1, S}, DType::f32);
  mask.fill(1.0);
  for (int64_t i = 0; i < S; ++i) {
    tokens.data<int32_t>()[i] = int32_t(i * 3 % config.vocab_size);
    labels.data<int32_t>()[i] = int32_t((i * 3 + 1) % config.vocab_size);
  }
  for (int step = 0; step < 3; ++step) {
    ddp.zero_grad();
    model.forward_backward(tokens, labels, mask, 1.0f / float(S), {.training = true, .step = uint64_t(step)});
    ddp.finish_grad_sync();
    model.update_fp8_scales();
    optimizer.step({1e-2, 0.0});
    check("after a step");
  }
}

// The single rank with and without the flag, DP=2 with it, and checkpoints across both.
void expect_curves(Recipe recipe) {
  const std::string name = recipe_name(recipe);
  const TrainingSummary plain = train(ParallelContext::single_process(), run_args(12), recipe, false);
  ::testing::internal::CaptureStdout();
  const TrainingSummary single = train(ParallelContext::single_process(), run_args(12), recipe);
  const std::string log = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(single.train_losses.size(), 12u);
  // The log says so: 2 layers x 4 linear layers.
  EXPECT_NE(log.find("> FP8 parameters (--fp8-param-gather): 8 weights"), std::string::npos) << log;
  // The same casts of values a bf16 rounding apart: a weight near the midpoint of two FP8 values
  // may round the other way, 2^-4 of itself, so the curves part slowly. Bound 1e-3 relative
  // (measured when this was written: 1.9e-4 delayed, 7.4e-5 tensorwise).
  const double flag_gap = worst_gap(plain, single, 0);
  EXPECT_LE(flag_gap, 1e-3) << name;
  std::printf("%s: --fp8-param-gather against bf16 weights, largest relative loss difference %.2e\n", name.c_str(),
              flag_gap);

  std::unique_ptr<TempDir> owner;
  std::string dir;
  TrainingSummary wide;
  {
    const ParallelState st = make_state({}, 60);
    if (st.ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
    dir = shared_directory(owner.get());
    wide = train(st.ctx, with(run_args(12), {"--save", dir + "/dp", "--save-interval", "6"}), recipe);
    st.ctx.world->barrier();
  }
  // DP=2 sums the gradients and the norm's squares in another order, and FP8 magnifies a master
  // one f32 ulp apart that crosses an FP8 rounding boundary (2^-4 of the weight). Measured when
  // this was written: 2.0e-4 (delayed), 3.8e-5 (tensorwise), and 1.7e-4 for the delayed recipe's
  // DP=2 without the flag. Bound 5e-4; a cast with a wrong scale or an amax not reduced moves the
  // curve by percents.
  constexpr double kDpBound = 5e-4;
  const double dp_gap = worst_gap(single, wide, 0);
  EXPECT_LE(dp_gap, kDpBound) << name << " DP=2";
  std::printf("%s: DP=2 against one rank, largest relative loss difference %.2e\n", name.c_str(), dp_gap);
  {
    // The gathers overlapped with the next forward (each FP8 bucket waited for just before its
    // weights are read): the same steps, bit for bit.
    const ParallelState st = make_state({}, 60);
    const TrainingSummary overlapped =
        train(st.ctx, with(run_args(12), {"--overlap-grad-reduce", "--overlap-param-gather"}), recipe);
    EXPECT_EQ(overlapped.train_losses, wide.train_losses) << name << " DP=2 with --overlap-param-gather";
  }
  {
    // TP=2 with SP: each rank casts its shard of every weight. The delayed recipe's amaxes are
    // max-reduced over TP as well, so its casts are the single rank's (DP=2's bound); tensorwise
    // scales each shard by its own amax, with or without the flag, so it is held to TP=2's run
    // without the flag (the flag's bound, 1e-3).
    const ParallelState st = make_state({.tp = 2}, 60);
    const std::vector<std::string> tp_run = with(run_args(12), tp_flags(2, true, false));
    const TrainingSummary tp = train(st.ctx, tp_run, recipe);
    const bool delayed = recipe == Recipe::delayed;
    const double tp_gap = worst_gap(delayed ? single : train(st.ctx, tp_run, recipe, false), tp, 0);
    EXPECT_LE(tp_gap, delayed ? kDpBound : 1e-3) << name << " TP=2";
    std::printf("%s: TP=2 against %s, largest relative loss difference %.2e\n", name.c_str(),
                delayed ? "one rank" : "TP=2 with bf16 weights", tp_gap);
  }

  const ParallelState st = make_state({}, 60);
  if (st.ctx.world->rank() == 0) {
    // The same layout resumed: bit for bit (the masters, moments and recipe state come back, and
    // the weights are cast from the masters at the restored scale).
    train(ParallelContext::single_process(),
          with(run_args(12), {"--save", dir + "/single", "--save-interval", "6", "--exit-interval", "6"}), recipe);
    const TrainingSummary resumed =
        train(ParallelContext::single_process(), with(run_args(12), {"--load", dir + "/single"}), recipe);
    ASSERT_EQ(resumed.train_losses.size(), 6u) << name;
    for (size_t i = 0; i < 6; ++i)
      EXPECT_EQ(resumed.train_losses[i], single.train_losses[6 + i]) << name << " resumed iteration " << 7 + i;
    // DP=2's checkpoint on one rank: its curve within DP=2's bound of the saving run.
    const TrainingSummary narrowed = train(ParallelContext::single_process(),
                                           with(run_args(12), {"--load", dir + "/dp", "--ckpt-step", "6"}), recipe);
    ASSERT_EQ(narrowed.train_losses.size(), 6u) << name;
    const double resume_gap = worst_gap(wide, narrowed, 6, 6);
    EXPECT_LE(resume_gap, kDpBound) << name << " DP=2 -> DP=1";
    std::printf("%s: DP=2 checkpoint resumed on one rank, largest relative loss difference %.2e\n", name.c_str(),
                resume_gap);
    // The checkpoints read the same without the flag (the weights' values in bf16, the masters
    // f32) and with it from one saved without it: within the flag's bound of the saving run.
    const TrainingSummary unflagged =
        train(ParallelContext::single_process(), with(run_args(12), {"--load", dir + "/dp", "--ckpt-step", "6"}),
              recipe, false);
    const double unflagged_gap = worst_gap(wide, unflagged, 6, 6);
    EXPECT_LE(unflagged_gap, 1e-3) << name << " resumed without the flag";
    train(ParallelContext::single_process(),
          with(run_args(12), {"--save", dir + "/plain", "--save-interval", "6", "--exit-interval", "6"}), recipe,
          false);
    const TrainingSummary flagged =
        train(ParallelContext::single_process(), with(run_args(12), {"--load", dir + "/plain"}), recipe);
    const double flagged_gap = worst_gap(plain, flagged, 6, 6);
    EXPECT_LE(flagged_gap, 1e-3) << name << " a checkpoint without the flag resumed with it";
    std::printf("%s: resumed without the flag %.2e, a checkpoint without it resumed with it %.2e\n", name.c_str(),
                unflagged_gap, flagged_gap);
  }
  st.ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

TEST(Fp8ParamGather, DelayedWeightsAreTheirMastersCast) { expect_weights_held_in_fp8(Recipe::delayed); }
TEST(Fp8ParamGather, TensorwiseWeightsAreTheirMastersCast) { expect_weights_held_in_fp8(Recipe::tensorwise); }
TEST(Fp8ParamGather, DelayedCurvesAndCheckpoints) { expect_curves(Recipe::delayed); }
TEST(Fp8ParamGather, TensorwiseCurvesAndCheckpoints) { expect_curves(Recipe::tensorwise); }

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
