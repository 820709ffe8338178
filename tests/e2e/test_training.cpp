// End-to-end training on the CPU: resume is bit-exact (bf16, fp16 with dynamic loss scaling,
// MoE with expert biases), fp16 tracks fp32, and an fp16 overflow skips the step as Megatron does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "e2e/e2e_util.h"
#include "megatron/checkpointing/checkpoint.h"
#include "megatron/datasets/indexed_dataset.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/optimizer/grad_scaler.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_io.h"
#include "megatron/training/training.h"

using namespace megatron;
using megatron::testing::TempDir;

namespace {
std::vector<std::string> tiny_run(const std::string& extra_iters) {
  return {"--num-layers",
          "2",
          "--hidden-size",
          "32",
          "--num-attention-heads",
          "4",
          "--seq-length",
          "16",
          "--micro-batch-size",
          "2",
          "--global-batch-size",
          "4",
          "--train-iters",
          extra_iters,
          "--lr",
          "1e-3",
          "--lr-decay-style",
          "cosine",
          "--lr-warmup-iters",
          "3",
          "--mock-data",
          "--tokenizer-type",
          "NullTokenizer",
          "--vocab-size",
          "100",
          "--log-interval",
          "5",
          "--device",
          "cpu"};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

bool bit_equal(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Settings a test sets on the parsed arguments: FP8, which the CLI refuses without a GPU, runs on
// the CPU backend's exact emulation of the FP8 casts and GEMMs this way.
using ArgsEdit = std::function<void(TrainingArgs&)>;

TrainingSummary train(const std::vector<std::string>& argv, const ArgsEdit& edit) {
  if (!edit) return pretrain(parse_training_args(argv));
  TrainingArgs args = parse_training_args(argv);
  edit(args);
  return pretrain(args, ParallelContext::single_process(), Device::cpu());
}

// 20 iterations straight against 10, a checkpoint and 10 more: every loss bit for bit.
void expect_resume_is_bit_exact(const std::vector<std::string>& flags, const TempDir& dir, const ArgsEdit& edit = {}) {
  const TrainingSummary straight = train(with(tiny_run("20"), flags), edit);
  ASSERT_EQ(straight.train_losses.size(), 20u);
  const std::string ckpt = dir / "ckpt";
  train(with(tiny_run("10"), with(flags, {"--save", ckpt, "--save-interval", "10"})), edit);
  const TrainingSummary resumed = train(with(tiny_run("20"), with(flags, {"--load", ckpt})), edit);
  ASSERT_EQ(resumed.train_losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_TRUE(bit_equal(straight.train_losses[10 + i], resumed.train_losses[i]))
        << "iteration " << 11 + i << ": " << straight.train_losses[10 + i] << " vs " << resumed.train_losses[i];
    EXPECT_EQ(straight.loss_scales[10 + i], resumed.loss_scales[i]) << "iteration " << 11 + i;
  }
}

// The loss scale after each iteration as Megatron's scaler (unit-tested on its own) sets it from
// the iterations' overflows: the loop must feed it every step's outcome and nothing else.
std::vector<double> scales_from_overflows(const DynamicGradScalerParams& params, const std::vector<bool>& skipped) {
  DynamicGradScaler scaler(params);
  std::vector<double> scales;
  for (const bool overflow : skipped) {
    scaler.update(overflow);
    scales.push_back(scaler.scale());
  }
  return scales;
}
}  // namespace

// Dropout on (masks are counter-based), 16-bit compute with fp32 master weights and gradient
// accumulation over 2 micro-batches: every piece of state must survive the checkpoint. The LR
// schedule is pinned with --lr-decay-iters so the 10-iteration run schedules like the 20.
const std::vector<std::string> kResumeFlags = {"--attention-dropout", "0.1", "--hidden-dropout", "0.1",
                                               "--lr-decay-iters",    "20"};

TEST(Training, ResumeIsBitExact) {
  TempDir dir;
  expect_resume_is_bit_exact(with(kResumeFlags, {"--bf16"}), dir);
}

// MoE with DeepSeek-style routing (sigmoid scores, an expert bias moved every step, a shared
// expert), an aux loss and capacity drops, experts as the grouped GEMM: the routers' expert biases
// must travel with the checkpoint, or the resumed run routes differently from its first step.
TEST(Training, MoEResumeIsBitExact) {
  TempDir dir;
  expect_resume_is_bit_exact(with(kResumeFlags, {"--disable-bias-linear",
                                                 "--swiglu",
                                                 "--num-experts",
                                                 "8",
                                                 "--moe-router-topk",
                                                 "2",
                                                 "--moe-ffn-hidden-size",
                                                 "16",
                                                 "--moe-shared-expert-intermediate-size",
                                                 "16",
                                                 "--moe-router-score-function",
                                                 "sigmoid",
                                                 "--moe-router-enable-expert-bias",
                                                 "--moe-router-bias-update-rate",
                                                 "0.05",
                                                 "--moe-aux-loss-coeff",
                                                 "1e-2",
                                                 "--moe-expert-capacity-factor",
                                                 "1.5",
                                                 "--moe-grouped-gemm",
                                                 "--moe-layer-freq",
                                                 "[1,0]"}),
                             dir);
  // Saved as a model tensor, as Megatron's persistent buffer; layer 1 is dense.
  const auto reader = checkpointing::CheckpointReader::open(dir / "ckpt", 10);
  ASSERT_TRUE(reader.has("decoder.layers.0.mlp.router.expert_bias"));
  EXPECT_EQ(reader.info("decoder.layers.0.mlp.router.expert_bias").global_shape, (Shape{8}));
  EXPECT_FALSE(reader.has("decoder.layers.1.mlp.router.expert_bias"));
}

// With a window of 3 from 2^18 the scale grows at iterations 3, 6 and 9, the 10th overflows into
// the hysteresis (tracker 2 -> 1, asserted below), and the 11th overflow halves the scale at once:
// the resumed run must carry the scale and both trackers through the checkpoint.
TEST(Training, Fp16ResumeWithDynamicLossScalingIsBitExact) {
  TempDir dir;
  const std::vector<std::string> flags =
      with(kResumeFlags, {"--fp16", "--initial-loss-scale", "262144", "--loss-scale-window", "3"});
  expect_resume_is_bit_exact(flags, dir);
  const auto state =
      checkpointing::CheckpointReader::open(dir / "ckpt", 10).common().at("grad_scaler").get<GradScalerState>();
  EXPECT_EQ(state, (GradScalerState{2097152.0f, 0, 1}));
}

// FP8 GEMMs (hybrid: e4m3 forward, e5m2 output gradients) under delayed scaling with a history
// of 4 steps and its max: each step's scales come from the amaxes of the steps before, so every
// FP8 linear layer's scales and amax histories must travel with the checkpoint, or the resumed run
// casts its first steps with scale 1 and leaves the curve.
TEST(Training, Fp8DelayedScalingResumeIsBitExact) {
  TempDir dir;
  expect_resume_is_bit_exact(with(kResumeFlags, {"--bf16"}), dir, [](TrainingArgs& args) {
    args.model.fp8.fp8_format = "hybrid";
    args.model.fp8.fp8_recipe = "delayed";
    args.model.fp8.fp8_amax_history_len = 4;
    args.model.fp8.fp8_amax_compute_algo = "max";
  });
  // Each of the 2 layers' 4 FP8 linear layers saved its state, named as Transformer Engine's.
  const auto reader = checkpointing::CheckpointReader::open(dir / "ckpt", 10);
  for (const char* layer :
       {"self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"})
    for (const std::string prefix : {"decoder.layers.0.", "decoder.layers.1."}) {
      const std::string name = prefix + layer + "._extra_state.";
      EXPECT_EQ(reader.info(name + "amax_history_fwd").global_shape, (Shape{4, 2})) << name;
      EXPECT_EQ(reader.info(name + "scale_bwd").global_shape, (Shape{1})) << name;
    }
}

// fp16 storage against the fp32 curve, with a loss scale (2^16) that never overflows here.
// Tolerances, relative: loss 1e-4, grad norm 3e-3. fp16 rounds weights and activations to a unit
// roundoff u = 2^-11 ~ 4.9e-4; the loss, a mean over tokens, averages those errors and measures
// below 1.4e-5 over these 40 iterations (bf16, 8x coarser, measures 1.4e-4), so 1e-4 keeps a 7x
// margin and stays below u. The grad norm sums products of fp16 activation gradients and measures
// below 3.1e-4 (~0.6 u): 3e-3 is a 10x margin, while a gradient left scaled by 2^16, or scaled
// twice, is off by orders of magnitude.
TEST(Training, Fp16TracksTheFp32Curve) {
  const std::vector<std::string> run = tiny_run("40");
  const TrainingSummary fp32 = pretrain(parse_training_args(run));
  const TrainingSummary fp16 = pretrain(parse_training_args(with(run, {"--fp16", "--initial-loss-scale", "65536"})));
  ASSERT_EQ(fp16.train_losses.size(), 40u);
  double worst_loss = 0, worst_norm = 0;
  for (size_t i = 0; i < 40; ++i) {
    ASSERT_FALSE(fp16.skipped[i]) << "iteration " << i + 1;
    worst_loss = std::max(worst_loss, std::abs(fp16.train_losses[i] / fp32.train_losses[i] - 1));
    worst_norm = std::max(worst_norm, std::abs(fp16.grad_norms[i] / fp32.grad_norms[i] - 1));
  }
  EXPECT_LT(worst_loss, 1e-4);
  EXPECT_LT(worst_norm, 3e-3);
  EXPECT_LT(fp16.train_losses.back(), fp16.train_losses.front() - 0.3);  // and it learns
}

// From 2^40 every step overflows fp16: three skipped iterations leave the weights at their
// initial values and the optimizer without a step, while the scaler backs off by Megatron's rule
// (the first overflow is absorbed by the hysteresis of 2, then the scale halves).
TEST(Training, Fp16OverflowSkipsTheStepAndKeepsTheParameters) {
  TempDir dir;
  const std::string ckpt = dir / "ckpt";
  const std::vector<std::string> argv =
      with(tiny_run("3"), {"--fp16", "--initial-loss-scale", "1099511627776", "--lr-decay-iters", "20", "--save", ckpt,
                           "--save-interval", "3"});
  const TrainingArgs args = parse_training_args(argv);
  const TrainingSummary s = pretrain(args);
  EXPECT_EQ(s.skipped, (std::vector<bool>{true, true, true}));
  EXPECT_EQ(s.loss_scales, (std::vector<double>{1099511627776.0, 549755813888.0, 274877906944.0}));
  for (double norm : s.grad_norms) EXPECT_TRUE(std::isnan(norm));  // not taken on a skipped step

  const auto reader = checkpointing::CheckpointReader::open(ckpt, 3);
  const nlohmann::json& common = reader.common();
  EXPECT_EQ(common.at("grad_scaler").get<GradScalerState>(), (GradScalerState{274877906944.0f, 0, -1}));
  EXPECT_EQ(common.at("optimizer_step"), 0);
  EXPECT_EQ(common.at("scheduler_num_steps"), 0);  // Megatron does not step the scheduler either
  EXPECT_EQ(common.at("skipped_iterations"), 3);
  EXPECT_EQ(common.at("consumed_train_samples"), 3 * args.global_batch_size);  // but the data moves on

  const ParallelContext ctx = ParallelContext::single_process();
  GPTModel initial(args.model, ctx), trained(args.model, ctx);
  initial.parameters().initialize(uint64_t(args.seed));
  load_model_weights(ckpt, trained);
  EXPECT_EQ(trained.parameters().param_buffer().to_vector(), initial.parameters().param_buffer().to_vector());
  Tensor exp_avg = Tensor::empty({args.model.hidden_size}, DType::f32);
  reader.load("optimizer.decoder.final_layernorm.weight.exp_avg", {0}, exp_avg);
  EXPECT_EQ(exp_avg.to_vector(), std::vector<float>(size_t(args.model.hidden_size), 0.0f));
}

// Megatron's log counts skipped (and nan) iterations per interval and leaves the grad norm out
// of a line whose iteration was skipped; the metrics file says the same. From the default 2^32
// the first iterations overflow until the scale fits fp16.
TEST(Training, Fp16LogCountsSkippedIterationsPerInterval) {
  TempDir dir;
  const std::string metrics = dir / "metrics.jsonl";
  const TrainingSummary s = pretrain(parse_training_args(with(tiny_run("20"), {"--fp16", "--metrics-file", metrics})));
  const int64_t skipped = std::count(s.skipped.begin(), s.skipped.end(), true);
  EXPECT_GT(skipped, 5);
  EXPECT_LT(skipped, 15);  // ... and training proceeds
  EXPECT_EQ(s.loss_scales, scales_from_overflows({}, s.skipped));

  std::ifstream in(metrics);
  int64_t logged_skipped = 0, previous = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const int64_t it = j.at("iteration").get<int64_t>();
    const int64_t in_interval = std::count(s.skipped.begin() + previous, s.skipped.begin() + it, true);
    EXPECT_EQ(j.at("skipped_iterations"), in_interval) << "iteration " << it;
    EXPECT_EQ(j.at("nan_iterations"), 0) << "iteration " << it;  // the losses stay finite
    EXPECT_EQ(j.at("grad_norm").is_null(), bool(s.skipped[size_t(it - 1)])) << "iteration " << it;
    EXPECT_EQ(j.at("loss_scale"), s.loss_scales[size_t(it - 1)]) << "iteration " << it;
    logged_skipped += in_interval;
    previous = it;
  }
  EXPECT_EQ(previous, 20);
  EXPECT_EQ(logged_skipped, skipped);
}

TEST(Training, ResetAttentionMaskReachesAttention) {
  // Documents of 3-9 tokens, so every 16-token sample spans EOD tokens (id 99): document masking
  // must change the first iteration's loss (same init, same data), and training stays finite.
  TempDir dir;
  const std::string prefix = dir / "docs";
  {
    datasets::IndexedDatasetBuilder builder(prefix, datasets::IndexDType::u16);
    for (int d = 0; d < 200; ++d) {
      std::vector<int32_t> ids;
      for (int t = 0; t < 2 + d % 7; ++t) ids.push_back((d * 7 + t * 3) % 99);
      ids.push_back(99);
      builder.add_document(ids);
    }
    builder.finalize();
  }
  std::vector<std::string> run = tiny_run("3");
  std::erase(run, std::string("--mock-data"));
  run = with(run, {"--data-path", prefix, "--split", "100,0,0", "--lr-decay-iters", "10"});
  const TrainingSummary plain = pretrain(parse_training_args(run));
  const TrainingSummary masked = pretrain(parse_training_args(with(run, {"--reset-attention-mask"})));
  ASSERT_EQ(plain.train_losses.size(), 3u);
  ASSERT_EQ(masked.train_losses.size(), 3u);
  EXPECT_NE(plain.train_losses[0], masked.train_losses[0]);
  for (double loss : masked.train_losses) EXPECT_TRUE(std::isfinite(loss));
}

// --recompute-* through the training loop: with dropout on and 2 micro-batches per step, every
// loss and grad norm equals the run that keeps all activations bit for bit (the recomputed
// forward reruns the same kernels with the same counter-based masks), and the activation memory
// the metrics file reports per micro-batch is lower.
TEST(Training, RecomputeKeepsTheCurveBitForBitWithLessActivationMemory) {
  TempDir dir;
  const auto train = [&](const std::string& name, const std::vector<std::string>& flags) {
    const std::string metrics = dir / (name + ".jsonl");
    const TrainingSummary s = pretrain(
        parse_training_args(with(tiny_run("6"), with(with(kResumeFlags, flags), {"--metrics-file", metrics}))));
    std::ifstream in(metrics);
    std::string first;
    std::getline(in, first);
    return std::pair{s, nlohmann::json::parse(first).at("activation_memory_mib").get<double>()};
  };
  const auto [kept, kept_mib] = train("kept", {});
  const std::vector<std::vector<std::string>> settings = {
      {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"},
      {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"},
      {"--recompute-activations"},
      {"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"}};
  for (size_t k = 0; k < settings.size(); ++k) {
    const auto [again, mib] = train("recompute" + std::to_string(k), settings[k]);
    ASSERT_EQ(again.train_losses.size(), kept.train_losses.size());
    for (size_t i = 0; i < kept.train_losses.size(); ++i) {
      EXPECT_TRUE(bit_equal(kept.train_losses[i], again.train_losses[i])) << "setting " << k << ", iteration " << i + 1;
      EXPECT_TRUE(bit_equal(kept.grad_norms[i], again.grad_norms[i])) << "setting " << k << ", iteration " << i + 1;
    }
    EXPECT_LT(mib, kept_mib) << "setting " << k;
  }
}
