// Megatron's --check-for-nan-in-loss-and-grad: which losses and optimizer steps end the run, for
// each precision and loss scaler, and that a non-finite loss prints no perplexity.
#include <gtest/gtest.h>

#include <limits>

#include "megatron/training/metrics.h"
#include "megatron/training/nan_check.h"
#include "test_util.h"

using namespace megatron;
using megatron::testing::error_of;

namespace {
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

NanCheck check(const std::vector<std::string>& flags) {
  return NanCheck(parse_training_args(megatron::testing::minimal_train_argv(flags)));
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

const OptimizerStepResult kApplied{.grad_norm = 1.5, .skipped = false};
const OptimizerStepResult kOverflow{.grad_norm = std::nullopt, .skipped = true};  // a scaler found inf
OptimizerStepResult non_finite_norm(double norm) { return {.grad_norm = norm, .skipped = true}; }
}  // namespace

TEST(NanCheck, NonFiniteLossStopsNamingTheIterationAndRank) {
  for (const std::vector<std::string>& precision : {std::vector<std::string>{}, {"--bf16"}}) {
    const NanCheck c = check(precision);
    EXPECT_EQ(error_of([&] { c.micro_batch_loss(123.0, 32, 7, 0); }), "(no error)");
    const std::string nan = error_of([&] { c.micro_batch_loss(kNan, 32, 7, 3); });
    EXPECT_TRUE(contains(nan, "iteration 7: found NaN in local forward loss calculation on rank 3")) << nan;
    EXPECT_TRUE(contains(nan, "--no-check-for-nan-in-loss-and-grad")) << nan;
    EXPECT_TRUE(contains(error_of([&] { c.micro_batch_loss(kInf, 32, 7, 0); }), "found Inf in local forward loss"));
    EXPECT_TRUE(contains(error_of([&] { c.validation_loss(kNan, 10); }), "iteration 10: found NaN in the validation"));
    EXPECT_EQ(error_of([&] { c.validation_loss(4.5, 10); }), "(no error)");
  }
}

TEST(NanCheck, NonFiniteGradientNormStops) {
  const NanCheck c = check({"--bf16"});
  EXPECT_EQ(error_of([&] { c.optimizer_step(kApplied, 1.0f, 4); }), "(no error)");
  EXPECT_TRUE(contains(error_of([&] { c.optimizer_step(non_finite_norm(kNan), 1.0f, 4); }),
                       "iteration 4: found NaN in the gradient norm"));
  EXPECT_TRUE(contains(error_of([&] { c.optimizer_step(non_finite_norm(kInf), 1.0f, 4); }),
                       "iteration 4: found Inf in the gradient norm"));
}

// Dynamic scaling: overflows are the scaler's signal (Megatron turns the check off), until the
// scale cannot back off any more.
TEST(NanCheck, Fp16DynamicScalingSkipsUntilTheMinimumScale) {
  const NanCheck c = check({"--fp16", "--min-loss-scale", "4"});
  EXPECT_EQ(error_of([&] { c.optimizer_step(kOverflow, 8.0f, 5); }), "(no error)");
  EXPECT_EQ(error_of([&] { c.micro_batch_loss(kNan, 32, 5, 0); }), "(no error)") << "the scaler's signal";
  EXPECT_EQ(error_of([&] { c.validation_loss(kNan, 5); }), "(no error)");
  const std::string at_min = error_of([&] { c.optimizer_step(kOverflow, 4.0f, 6); });
  EXPECT_TRUE(contains(at_min, "iteration 6: the gradients still overflow at the minimum loss scale 4")) << at_min;
  EXPECT_TRUE(contains(at_min, "--min-loss-scale")) << at_min;
}

// A static scale cannot back off: Megatron keeps the check on, so its first overflow stops.
TEST(NanCheck, StaticLossScaleOverflowStops) {
  for (const char* precision : {"--fp16", "--bf16"}) {
    const NanCheck c = check({precision, "--loss-scale", "1024"});
    EXPECT_TRUE(contains(error_of([&] { c.optimizer_step(kOverflow, 1024.0f, 2); }),
                         "iteration 2: the gradients overflow at the static loss scale 1024 (--loss-scale)"));
    EXPECT_TRUE(contains(error_of([&] { c.micro_batch_loss(kNan, 32, 2, 0); }), "found NaN"));
  }
}

TEST(NanCheck, OffSkipsAsBefore) {
  for (const std::vector<std::string>& precision :
       {std::vector<std::string>{}, {"--bf16"}, {"--fp16"}, {"--fp16", "--loss-scale", "8"}}) {
    std::vector<std::string> flags = precision;
    flags.push_back("--no-check-for-nan-in-loss-and-grad");
    const NanCheck c = check(flags);
    EXPECT_EQ(error_of([&] { c.micro_batch_loss(kNan, 32, 2, 0); }), "(no error)");
    EXPECT_EQ(error_of([&] { c.optimizer_step(non_finite_norm(kNan), 1.0f, 2); }), "(no error)");
    EXPECT_EQ(error_of([&] { c.optimizer_step(kOverflow, 1.0f, 2); }), "(no error)");
    EXPECT_EQ(error_of([&] { c.validation_loss(kInf, 2); }), "(no error)");
  }
}

// Megatron's PPL = exp(min(20, loss)), worked out by hand: e^2 = 7.389056, e^20 = 4.851652e8. A
// NaN loss would print e^20 by that formula; it prints no perplexity.
TEST(NanCheck, ValidationLineHasNoPerplexityForANonFiniteLoss) {
  EXPECT_TRUE(
      contains(format_validation_line("iteration 3", 2.0), "lm loss value: 2.000000E+00 | lm loss PPL: 7.389056E+00 |"));
  EXPECT_TRUE(contains(format_validation_line("iteration 3", 25.0), "lm loss PPL: 4.851652E+08 |"));
  for (const double loss : {kNan, kInf}) {
    const std::string line = format_validation_line("iteration 3", loss);
    EXPECT_TRUE(contains(line, "validation loss at iteration 3 | lm loss value: ")) << line;
    EXPECT_FALSE(contains(line, "PPL")) << line;
  }
}
