// Megatron's learning-rate schedule (megatron/core/optimizer_param_scheduler.py, lengths from
// training.py's get_optimizer_param_scheduler) at chosen steps, against values worked out by hand
// from its formulas. The scheduler counts samples: after iteration k it stands at k * GBS.
//   warmup (steps <= W, W > 0):   lr = init + (lr_max - init) * steps / W
//   constant:                     lr = lr_max
//   steps > D:                    lr = min_lr
//   inverse-square-root:          lr = max(min_lr, lr_max * max(W, 1)**0.5 / max(steps, 1)**0.5)
//   otherwise r = (steps - W) / (D - W), lr = min_lr + c * (lr_max - min_lr) with
//     linear c = 1 - r; cosine c = (cos(pi r) + 1) / 2;
//     WSD: A = D - WSD; c = 1 up to A, then q = (steps - A) / WSD and c = 2 * 0.5**q - 1
//     (exponential), 1 - q (linear), (cos(pi q) + 1) / 2 (cosine), 1 - sqrt(q) (minus_sqrt).
// With --train-iters: D = lr-decay-iters * GBS, W = lr-warmup-iters * GBS, WSD = lr-wsd-decay-iters
// * GBS; with --train-samples the *-samples flags give them directly; --lr-warmup-fraction makes
// W = fraction * D, not rounded.
//
// Every case below: GBS 2 (micro-batch 2, one rank), lr 0.01 and, unless said, --min-lr 0.001,
// so lr = 0.001 + 0.009 c. Tolerance: the hand values are decimal and the code rounds a handful of
// times, so they agree to a few units of 2^-53 relative; 1e-13 relative allows ~450 of those,
// while the slightest formula slip (one sample of warmup, one step of decay) moves the LR by more
// than 1e-3 relative.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "megatron/optimizer/lr_scheduler.h"
#include "megatron/training/arguments.h"
#include "test_util.h"

using namespace megatron;

namespace {

using Argv = std::vector<std::string>;

// The smallest run without its length and LR flags, then `extra`.
OptimizerParamScheduler scheduler_for(const Argv& extra) {
  Argv argv;
  const Argv base = megatron::testing::minimal_train_argv();
  for (size_t i = 0; i < base.size(); ++i) {
    if (base[i] == "--train-iters" || base[i] == "--lr") {
      ++i;  // and its value
      continue;
    }
    argv.push_back(base[i]);
  }
  argv.insert(argv.end(), {"--lr", "0.01"});
  argv.insert(argv.end(), extra.begin(), extra.end());
  const TrainingArgs args = parse_training_args(argv);
  EXPECT_EQ(args.global_batch_size, 2);
  return OptimizerParamScheduler(args.optimizer, args.train_iters, args.global_batch_size);
}

struct Point {
  int64_t steps;  // consumed samples
  double lr;      // worked out by hand
};

void expect_schedule(const Argv& extra, const std::vector<Point>& points) {
  const OptimizerParamScheduler scheduler = scheduler_for(extra);
  for (const Point& p : points) {
    EXPECT_NEAR(scheduler.lr_at(p.steps), p.lr, 1e-13 * p.lr) << "at " << p.steps << " samples";
  }
}

const Argv kIters = {"--train-iters", "10", "--lr-warmup-iters", "2", "--min-lr", "0.001"};  // D = 20, W = 4

Argv with(Argv a, const Argv& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

}  // namespace

// W = 4 from --lr-warmup-init 0.002: 0.002 + 0.008 * steps / 4; then lr_max for good, even
// past D (constant returns before the min_lr rule).
TEST(LrSchedule, Constant) {
  expect_schedule(with(kIters, {"--lr-decay-style", "constant", "--lr-warmup-init", "0.002"}),
                  {{0, 0.002}, {2, 0.006}, {4, 0.01}, {6, 0.01}, {20, 0.01}, {40, 0.01}});
}

// r = (steps - 4) / 16. steps 8: r = 0.25, c = 0.75, 0.001 + 0.00675 = 0.00775; steps 16:
// r = 0.75, c = 0.25, 0.00325; steps 20: c = 0, min_lr; beyond D: min_lr.
TEST(LrSchedule, LinearWithWarmupAndMinLr) {
  expect_schedule(with(kIters, {"--lr-decay-style", "linear"}),
                  {{0, 0.0}, {2, 0.005}, {4, 0.01}, {8, 0.00775}, {16, 0.00325}, {20, 0.001}, {22, 0.001}});
}

// steps 8: r = 0.25, c = (cos(pi/4) + 1) / 2 = (0.7071067811865476 + 1) / 2 = 0.8535533905932738,
// lr = 0.001 + 0.009 * 0.8535533905932738 = 0.008681980515339464; steps 12: r = 0.5, c = 0.5,
// 0.0055; steps 16: r = 0.75, c = (1 - 0.7071067811865476) / 2 = 0.1464466094067262,
// lr = 0.001 + 0.0013180194846605358 = 0.0023180194846605358.
TEST(LrSchedule, Cosine) {
  expect_schedule(with(kIters, {"--lr-decay-style", "cosine"}),
                  {{2, 0.005}, {8, 0.008681980515339464}, {12, 0.0055}, {16, 0.0023180194846605358}, {20, 0.001}});
}

// D = 100 * 2 = 200 samples so the curve shows before min_lr takes over. W = 4:
// lr = 0.01 * 2 / sqrt(steps): steps 16: 0.005; 64: 0.0025; 100: 0.002; 144: 0.01 * 2 / 12 =
// 0.0016667 < min_lr 0.002, so 0.002. Without warmup W counts as 1: 0.01 / sqrt(max(steps, 1)).
TEST(LrSchedule, InverseSquareRoot) {
  expect_schedule({"--train-iters", "10", "--lr-decay-iters", "100", "--lr-warmup-iters", "2", "--min-lr", "0.002",
                   "--lr-decay-style", "inverse-square-root"},
                  {{2, 0.005}, {4, 0.01}, {16, 0.005}, {64, 0.0025}, {100, 0.002}, {144, 0.002}});
  expect_schedule({"--train-iters", "10", "--lr-decay-iters", "100", "--lr-decay-style", "inverse-square-root"},
                  {{0, 0.01}, {4, 0.005}, {16, 0.0025}, {100, 0.001}});
}

// WSD: D = 20, anneal 4 iterations = 8 samples from A = 12. Stable (c = 1) from the end of the
// warmup to A; then q = (steps - 12) / 8.
//   exponential: steps 16, q = 0.5: c = 2 * 0.7071067811865476 - 1 = 0.4142135623730951,
//     lr = 0.001 + 0.009 * 0.4142135623730951 = 0.004727922061357856; steps 20: c = 0.
//   linear: steps 14, q = 0.25: c = 0.75, 0.00775; steps 16: 0.0055.
//   cosine: steps 14: c = 0.8535533905932738, 0.008681980515339464; steps 16: 0.0055.
//   minus_sqrt: steps 14: c = 1 - 0.5, 0.0055; steps 18, q = 0.75: c = 1 - 0.8660254037844386 =
//     0.1339745962155614, lr = 0.001 + 0.0012057713659400526 = 0.0022057713659400526.
TEST(LrSchedule, WarmupStableDecayEachAnnealStyle) {
  const Argv wsd = with(kIters, {"--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "4"});
  const std::vector<Point> stable = {{2, 0.005}, {4, 0.01}, {8, 0.01}, {12, 0.01}};
  const auto expect_style = [&](const std::string& style, const std::vector<Point>& anneal) {
    std::vector<Point> points = stable;
    points.insert(points.end(), anneal.begin(), anneal.end());
    SCOPED_TRACE(style);
    expect_schedule(with(wsd, {"--lr-wsd-decay-style", style}), points);
  };
  expect_style("exponential", {{16, 0.004727922061357856}, {20, 0.001}, {22, 0.001}});
  expect_style("linear", {{14, 0.00775}, {16, 0.0055}, {20, 0.001}});
  expect_style("cosine", {{14, 0.008681980515339464}, {16, 0.0055}, {20, 0.001}});
  expect_style("minus_sqrt", {{14, 0.0055}, {18, 0.0022057713659400526}, {20, 0.001}});
}

// --lr-warmup-fraction 0.15 of D = 15 * 2 = 30 samples: W = 4.5, not a whole number (Megatron
// keeps the float). steps 4: still warming up, 0.01 * 4 / 4.5 = 0.008888888888888889; steps 6:
// r = 1.5 / 25.5 = 1/17, c = 16/17, lr = 0.001 + 0.009 * 16 / 17 = 0.009470588235294118.
// (Rounding W down to 4 would give 0.01 at steps 4 and 0.009307692307692308 at steps 6.)
TEST(LrSchedule, WarmupFractionOfTheDecay) {
  expect_schedule({"--train-iters", "15", "--lr-warmup-fraction", "0.15", "--min-lr", "0.001"},
                  {{2, 0.0044444444444444444}, {4, 0.008888888888888889}, {6, 0.009470588235294118}, {30, 0.001}});
}

// Sample-based training (--train-samples 40: 20 iterations of 2): --lr-decay-samples 30,
// --lr-warmup-samples 5, lengths no iteration count could give at GBS 2. steps 2: 0.01 * 2 / 5 =
// 0.004; 4: 0.008; 6: r = 1 / 25, c = 0.96, 0.001 + 0.00864 = 0.00964; 30: min_lr; 32: min_lr.
// Without --lr-decay-samples D = train-samples = 40: steps 6: r = 1/35, c = 34/35,
// lr = 0.001 + 0.009 * 34 / 35 = 0.009742857142857143. A fraction 0.1 of 40 gives W = 4:
// steps 2: 0.005. WSD over --lr-wsd-decay-samples 10 of D = 40, no warmup: A = 30, steps 35:
// q = 0.5, linear c = 0.5, 0.0055.
TEST(LrSchedule, SampleBasedLengths) {
  const Argv samples = {"--train-samples", "40", "--min-lr", "0.001"};
  expect_schedule(with(samples, {"--lr-decay-samples", "30", "--lr-warmup-samples", "5"}),
                  {{2, 0.004}, {4, 0.008}, {6, 0.00964}, {30, 0.001}, {32, 0.001}});
  expect_schedule(with(samples, {"--lr-warmup-samples", "5"}), {{6, 0.009742857142857143}, {40, 0.001}});
  expect_schedule(with(samples, {"--lr-warmup-fraction", "0.1"}), {{2, 0.005}, {4, 0.01}});
  expect_schedule(
      with(samples, {"--lr-decay-style", "WSD", "--lr-wsd-decay-samples", "10", "--lr-wsd-decay-style", "linear"}),
      {{0, 0.01}, {30, 0.01}, {35, 0.0055}, {40, 0.001}});
}

// --decoupled-lr 0.004 --decoupled-min-lr 0.0002 beside kIters' linear schedule (lr 0.01, min-lr
// 0.001, W = 4, D = 20): the same warmup and decay between the decoupled bounds. steps 2:
// 0.004 * 2 / 4 = 0.002; 4: 0.004; 8: r = 0.25, c = 0.75, 0.0002 + 0.75 * 0.0038 = 0.00305;
// 20 and beyond: 0.0002. Without --decoupled-min-lr the end is --min-lr: steps 8:
// 0.001 + 0.75 * 0.003 = 0.00325. The plain rate stays kIters' (0.00775 at 8); without the flag
// there is no decoupled rate.
TEST(LrSchedule, DecoupledLrTakesTheScheduleBetweenItsOwnBounds) {
  const auto decoupled_at = [](const Argv& extra, int64_t steps) {
    OptimizerParamScheduler scheduler = scheduler_for(extra);
    scheduler.set_num_steps(steps);
    return scheduler.decoupled_lr();
  };
  const Argv both = with(kIters, {"--decoupled-lr", "0.004", "--decoupled-min-lr", "0.0002"});
  for (const Point& p : std::vector<Point>{{2, 0.002}, {4, 0.004}, {8, 0.00305}, {20, 0.0002}, {22, 0.0002}}) {
    const std::optional<double> lr = decoupled_at(both, p.steps);
    ASSERT_TRUE(lr.has_value());
    EXPECT_NEAR(*lr, p.lr, 1e-13 * p.lr) << "at " << p.steps << " samples";
  }
  EXPECT_NEAR(scheduler_for(both).lr_at(8), 0.00775, 1e-13);
  EXPECT_NEAR(decoupled_at(with(kIters, {"--decoupled-lr", "0.004"}), 8).value(), 0.00325, 1e-13);
  EXPECT_FALSE(decoupled_at(kIters, 8).has_value());
}

// Megatron's rules: a run counts its schedule in iterations or in samples, never both.
TEST(LrSchedule, IterationAndSampleFormsDoNotMix) {
  const auto error = [](const Argv& extra) { return megatron::testing::error_of([&] { scheduler_for(extra); }); };
  EXPECT_NE(error({"--train-iters", "10", "--train-samples", "40"}).find("are mutually exclusive"), std::string::npos);
  EXPECT_NE(error({"--train-iters", "10", "--lr-decay-samples", "30"})
                .find("--lr-decay-samples 30 does not go with --train-iters"),
            std::string::npos);
  EXPECT_NE(error({"--train-iters", "10", "--lr-warmup-samples", "3"}).find("--lr-warmup-samples 3 does not go"),
            std::string::npos);
  EXPECT_NE(error({"--train-samples", "40", "--lr-warmup-iters", "2"})
                .find("--lr-warmup-iters 2 does not go with --train-samples"),
            std::string::npos);
  EXPECT_NE(error({"--train-samples", "40", "--lr-decay-iters", "5"}).find("--lr-decay-iters 5 does not go"),
            std::string::npos);
  EXPECT_NE(error({"--train-samples", "40", "--lr-warmup-samples", "40"})
                .find("--lr-warmup-samples 40 is not below --lr-decay-samples 40"),
            std::string::npos);
  EXPECT_NE(error({"--train-samples", "40", "--lr-warmup-samples", "2", "--lr-warmup-fraction", "0.1"})
                .find("are mutually exclusive"),
            std::string::npos);
  EXPECT_NE(error({"--train-samples", "40", "--lr-decay-style", "WSD"}).find("needs --lr-wsd-decay-samples"),
            std::string::npos);
  EXPECT_NE(error({"--train-samples", "1"}).find("--train-samples 1 is less than one global batch (2 samples)"),
            std::string::npos);
  EXPECT_NE(error({"--train-iters", "10", "--lr-warmup-init", "0.02"}).find("--lr-warmup-init 0.02 exceeds --lr"),
            std::string::npos);
}

// The decoupled schedule obeys --lr's rules; Megatron would take these silently.
TEST(LrSchedule, DecoupledLrErrors) {
  const auto error = [](const Argv& extra) {
    return megatron::testing::error_of([&] { scheduler_for(with(kIters, extra)); });
  };
  EXPECT_NE(error({"--decoupled-min-lr", "0.001"}).find("--decoupled-min-lr 0.001 without --decoupled-lr"),
            std::string::npos);
  EXPECT_NE(error({"--decoupled-lr", "0"}).find("--decoupled-lr 0 must be positive"), std::string::npos);
  EXPECT_NE(error({"--decoupled-lr", "0.004", "--decoupled-min-lr", "0.005"})
                .find("--decoupled-min-lr 0.005 exceeds --decoupled-lr 0.004"),
            std::string::npos);
  EXPECT_NE(error({"--decoupled-lr", "0.004", "--decoupled-min-lr", "-1"}).find("--decoupled-min-lr -1 must be >= 0"),
            std::string::npos);
  EXPECT_NE(error({"--decoupled-lr", "0.0005"}).find("--min-lr 0.001 exceeds --decoupled-lr 0.0005"),
            std::string::npos);
  EXPECT_NE(error({"--decoupled-lr", "0.004", "--decoupled-min-lr", "0", "--lr-warmup-init", "0.005"})
                .find("--lr-warmup-init 0.005 exceeds --decoupled-lr 0.004"),
            std::string::npos);
}
