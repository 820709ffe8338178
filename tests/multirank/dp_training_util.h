#pragma once
// Shared by the training tests on CPU ranks (multirank/test_dp_training.cpp, test_tp_*.cpp) and on
// GPUs (multigpu/test_multigpu_*_training.cpp): tiny model runs, runs on a context or on one
// process, and the comparison of a run's curve with the single-rank curve of the same batches.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "megatron/training/arguments.h"
#include "megatron/training/training.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {

// A directory of this process's own for the mock data's index cache: Megatron's mock data is 100,000
// documents whatever the run, so at 16 tokens a sample each split's indices cover ~4.3M samples
// (~0.3 s a run to build, half a tiny run's time); a test's later runs of the same shapes load them.
// One directory a process, so ranks never write one file at once.
inline const std::string& mock_index_cache() {
  static const TempDir dir;
  return dir.path();
}

// 2 layers, hidden 32, sequences of 16 tokens in micro-batches of 1 (so every DP size up to the
// global batch sees the same micro-batch shapes), vocabulary 100, dropout on, an evaluation every
// 10 steps, the mock data's indices cached (mock_index_cache); the attention heads and model style
// are the callers'.
inline std::vector<std::string> tiny_model_run(int64_t iters, const std::string& device, int64_t global_batch) {
  return {"--num-layers",
          "2",
          "--hidden-size",
          "32",
          "--seq-length",
          "16",
          "--micro-batch-size",
          "1",
          "--global-batch-size",
          std::to_string(global_batch),
          "--train-iters",
          std::to_string(iters),
          "--lr-decay-iters",
          "20",
          "--lr",
          "3e-3",
          "--lr-warmup-iters",
          "2",
          "--mock-data",
          "--tokenizer-type",
          "NullTokenizer",
          "--vocab-size",
          "100",
          "--log-interval",
          "100",
          "--device",
          device,
          "--hidden-dropout",
          "0.1",
          "--attention-dropout",
          "0.1",
          "--eval-interval",
          "10",
          "--eval-iters",
          "2",
          "--data-cache-path",
          mock_index_cache()};
}

inline std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// The DP tests' model: 4 heads, 8 sequences per global batch.
inline std::vector<std::string> tiny_run(int64_t iters, const std::string& device = "cpu") {
  return with(tiny_model_run(iters, device, 8), {"--num-attention-heads", "4"});
}

// The models of the TP tests (multirank/test_tp_*.cpp, multigpu/test_multigpu_tp_training.cpp):
// GPT-2-style (learned positions, LayerNorm, GELU, biases, tied embeddings) and LLaMA-style (GQA,
// SwiGLU, RoPE, RMSNorm, untied, no biases), both dividing by TP = 1, 2 and 4.
enum class ModelStyle { gpt, llama };

inline const char* style_name(ModelStyle s) { return s == ModelStyle::gpt ? "GPT" : "LLaMA"; }

// tiny_model_run with 4 sequences per global batch; the padded vocabulary is 128 rows at TP 1, 2
// and 4, so checkpoints move between TP sizes.
inline std::vector<std::string> tiny_tp_run(ModelStyle style, int64_t iters, const std::string& device = "cpu") {
  const std::vector<std::string> common =
      with(tiny_model_run(iters, device, 4), {"--make-vocab-size-divisible-by", "32"});
  if (style == ModelStyle::gpt) return with(common, {"--num-attention-heads", "4"});
  return with(common, {"--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "4", "--swiglu",
                       "--ffn-hidden-size", "64", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                       "--untie-embeddings-and-output-weights", "--disable-bias-linear"});
}

// The models of the CP tests (multirank/test_cp_training.cpp, multigpu/test_multigpu_cp_training.cpp):
// tiny_tp_run without dropout (CP refuses it), optionally with document masking.
inline std::vector<std::string> tiny_cp_run(ModelStyle style, int64_t iters, bool documents = false,
                                            const std::string& device = "cpu") {
  std::vector<std::string> argv;
  for (const std::string& arg : tiny_tp_run(style, iters, device)) {
    const bool dropout_value = !argv.empty() && (argv.back() == "--hidden-dropout" || argv.back() == "--attention-dropout");
    argv.push_back(dropout_value ? std::string("0") : arg);
  }
  if (documents) argv = with(argv, {"--reset-attention-mask", "--reset-position-ids"});
  return argv;
}

// The models of the PP tests (multirank/test_pp_training.cpp, multigpu/test_multigpu_pp_training.cpp):
// tiny_tp_run with 4 layers, so every PP up to 4 divides them.
inline std::vector<std::string> tiny_pp_run(ModelStyle style, int64_t iters, const std::string& device = "cpu") {
  std::vector<std::string> argv = tiny_tp_run(style, iters, device);
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--num-layers") argv[i + 1] = "4";
  return argv;
}

// The MoE tests' experts (multirank/test_moe_training.cpp, multigpu/test_multigpu_ep_training.cpp):
// 4 experts with DeepSeek-style routing (sigmoid scores, an expert bias moved every step), the aux
// loss and the grouped GEMM, dropless.
inline std::vector<std::string> moe_flags() {
  return {"--disable-bias-linear",
          "--swiglu",
          "--num-experts",
          "4",
          "--moe-router-score-function",
          "sigmoid",
          "--moe-router-enable-expert-bias",
          "--moe-router-bias-update-rate",
          "0.05",
          "--moe-aux-loss-coeff",
          "1e-2",
          "--moe-grouped-gemm"};
}

// The MoE tests under tensor parallelism: TP 2 with sequence parallelism (Megatron's rule for MoE
// under TP), experts split over TP (expert TP = TP), the vocabulary padded to the single rank's
// 128 rows.
inline std::vector<std::string> moe_tp2_flags() {
  return {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--make-vocab-size-divisible-by", "32"};
}

inline std::vector<std::string> tp_flags(int tp, bool sequence_parallel, bool distributed_optimizer) {
  std::vector<std::string> f = {"--tensor-model-parallel-size", std::to_string(tp)};
  if (sequence_parallel) f.push_back("--sequence-parallel");
  if (distributed_optimizer) f.push_back("--use-distributed-optimizer");
  return f;
}

inline TrainingSummary train_single_rank(const std::vector<std::string>& argv) {
  return pretrain(parse_training_args(argv, 1), ParallelContext::single_process(), Device::cpu());
}

inline TrainingSummary train_on(const ParallelContext& ctx, const std::vector<std::string>& argv) {
  return pretrain(parse_training_args(argv, ctx.world->size()), ctx, Device::cpu());
}

// train_on in f64, which has no flag: it exists for checks like the layout tests'.
inline TrainingSummary run_f64(const ParallelContext& ctx, const std::vector<std::string>& argv) {
  TrainingArgs args = parse_training_args(argv, ctx.world->size());
  args.model.params_dtype = DType::f64;
  return pretrain(args, ctx, Device::cpu());
}

// Expects actual[i] within `tolerance` (relative) of expected[first_expected + i]; returns the
// largest relative deviation seen, so tests can print how much of the tolerance was used.
inline double expect_close(const std::vector<double>& expected, const std::vector<double>& actual,
                           size_t first_expected, double tolerance, const std::string& what) {
  EXPECT_EQ(actual.size() + first_expected, expected.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < actual.size() && first_expected + i < expected.size(); ++i) {
    const double e = expected[first_expected + i];
    EXPECT_LE(std::abs(actual[i] - e), tolerance * std::abs(e))
        << what << ": value " << first_expected + i << " is " << actual[i] << ", single rank " << e;
    worst = std::max(worst, std::abs(actual[i] - e) / std::abs(e));
  }
  return worst;
}

// Iterations [first, ...) of `single` against all of `s`: the loss and, where asked, the gradient
// norm. Returns the largest relative deviation.
inline double expect_same_curve(const TrainingSummary& single, const TrainingSummary& s, size_t first, double tolerance,
                                bool compare_grad_norm, const std::string& what) {
  double worst = expect_close(single.train_losses, s.train_losses, first, tolerance, what + " loss");
  if (compare_grad_norm)
    worst = std::max(worst, expect_close(single.grad_norms, s.grad_norms, first, tolerance, what + " grad norm"));
  // --log-params-norm's values (whole runs only: a resumed one logs at other iterations).
  if (first == 0)
    worst = std::max(worst, expect_close(single.params_norms, s.params_norms, 0, tolerance, what + " params norm"));
  // fp16: the same steps skipped and the same loss scales (always equal for other precisions).
  EXPECT_EQ(std::vector<bool>(single.skipped.begin() + long(first), single.skipped.end()), s.skipped) << what;
  EXPECT_EQ(std::vector<double>(single.loss_scales.begin() + long(first), single.loss_scales.end()), s.loss_scales)
      << what;
  return worst;
}

// A whole run against the single rank's: the training curve with its gradient norms, the
// validation during training and the one after it, each within `tolerance` relative. With `print`
// (world rank 0), says how much of the tolerance the largest deviation used, in units of f64's u.
inline void expect_same_run(const TrainingSummary& single, const TrainingSummary& s, double tolerance,
                            const std::string& what, bool print) {
  double worst = expect_same_curve(single, s, 0, tolerance, /*compare_grad_norm=*/true, what);
  worst = std::max(worst, expect_close(single.valid_losses, s.valid_losses, 0, tolerance, what + " validation loss"));
  worst = std::max(worst, expect_close({*single.end_valid_loss}, {*s.end_valid_loss}, 0, tolerance,
                                       what + " final validation loss"));
  if (print)
    std::printf("%s: largest deviation %.1f u of the %.0f u allowed\n", what.c_str(), worst / 0x1p-53,
                tolerance / 0x1p-53);
}

// The PP tests' interleaved layout of tiny_pp_run at PP=2: two model chunks of one layer per rank,
// virtual stages 0 and 2 on rank 0, 1 and 3 on rank 1.
inline std::vector<std::string> pp2_interleaved_flags() {
  return {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"};
}

// A layout of the world and the model style it trains (the PP tests).
struct PpLayout {
  std::string name;
  ModelStyle style;
  ParallelSizes sizes;
  std::vector<std::string> flags;
};

// Each layout's f64 run of tiny_pp_run (`iterations`, a validation at the end) follows the single
// rank's within `tolerance` relative (expect_same_run).
inline void expect_pp_layouts_follow_the_single_rank(const std::vector<PpLayout>& layouts, int64_t iterations,
                                                     double tolerance) {
  std::map<ModelStyle, TrainingSummary> single;
  for (const PpLayout& l : layouts) {
    // --log-params-norm: each stage's parameters (the tied embedding's copy once) in the norm.
    const std::vector<std::string> run = with(tiny_pp_run(l.style, iterations), {"--log-params-norm"});
    if (!single.count(l.style)) {
      single[l.style] = run_f64(ParallelContext::single_process(), run);
      ASSERT_EQ(single[l.style].valid_losses.size(), 1u);
      ASSERT_EQ(single[l.style].params_norms.size(), 2u);  // after the first iteration and the last
    }
    const ParallelState st = make_state(l.sizes, 60);
    const std::string what = std::string(style_name(l.style)) + " " + l.name;
    const TrainingSummary s = run_f64(st.ctx, with(run, l.flags));
    expect_same_run(single[l.style], s, tolerance, what, st.ctx.world->rank() == 0);
  }
}

}  // namespace megatron::testing
