// ProgressReporter: rate-limited progress lines with an ETA for long start-up phases. A fake clock
// (the test hook) makes a phase exactly as slow as the test needs; the expected lines are worked
// out by hand from the steps and the seconds given.
#include <gtest/gtest.h>

#include <string>

#include "megatron/core/logging.h"
#include "megatron/core/progress.h"
#include "megatron/datasets/blended_dataset.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_io.h"
#include "test_util.h"

namespace megatron {
namespace {

using Clock = ProgressReporter::Clock;

// A clock that stands still until the test moves it.
struct FakeClock {
  Clock::time_point t{};
  std::function<Clock::time_point()> fn() {
    return [this] { return t; };
  }
};

std::string run_captured(const std::function<void()>& body) {
  ScopedLogRank rank0(0);
  ::testing::internal::CaptureStdout();
  body();
  return ::testing::internal::GetCapturedStdout();
}

TEST(Progress, SlowPhaseReportsEveryIntervalWithEtaAndAFinalLine) {
  FakeClock clock;
  const std::string out = run_captured([&] {
    ProgressReporter progress("phase", 10, "files", std::chrono::seconds(5), clock.fn());
    for (int step = 0; step < 10; ++step) {  // one file per second
      clock.t += std::chrono::seconds(1);
      progress.advance();
    }
    progress.finish();
  });
  // After 5 s, 5 of 10 done at 1 file/s: 5 s left; after 10 s, none left; no line in between
  // (the 5 s interval).
  EXPECT_EQ(out,
            "> phase: 5 of 10 files (50%) after 5 s, ETA 5 s\n"
            "> phase: 10 of 10 files (100%) after 10 s, ETA 0 s\n"
            "> phase: done, 10 files in 10.0 s\n");
}

TEST(Progress, UnevenRateExtrapolatesTheRateSoFar) {
  FakeClock clock;
  const std::string out = run_captured([&] {
    ProgressReporter progress("phase", 100, "bytes", std::chrono::seconds(5), clock.fn());
    clock.t += std::chrono::seconds(6);
    progress.advance(20);  // 20 bytes in 6 s: 80 left take 24 s
  });
  EXPECT_EQ(out, "> phase: 20 of 100 bytes (20%) after 6 s, ETA 24 s\n");
}

TEST(Progress, FastPhasePrintsNothing) {
  FakeClock clock;
  const std::string out = run_captured([&] {
    ProgressReporter progress("phase", 10, "files", std::chrono::seconds(5), clock.fn());
    for (int step = 0; step < 10; ++step) {
      clock.t += std::chrono::milliseconds(100);
      progress.advance();
    }
    progress.finish();
  });
  EXPECT_EQ(out, "");
}

TEST(Progress, OnlyRankZeroPrints) {
  FakeClock clock;
  ScopedLogRank rank1(1);
  ::testing::internal::CaptureStdout();
  ProgressReporter progress("phase", 2, "files", std::chrono::seconds(1), clock.fn());
  clock.t += std::chrono::seconds(2);
  progress.advance(2);
  progress.finish();
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
}

// The real blending-index phase reports through the reporter: every 2^20 samples, so a blend of
// 3 * 2^20 samples at one fake second per report gives three lines and the final one.
TEST(Progress, BlendingIndicesReportWhileBuilding) {
  FakeClock clock;
  int reads = 0;
  const int64_t size = int64_t(3) << 20;
  const std::string out = run_captured([&] {
    ProgressReporter progress("blend", size, "samples", std::chrono::seconds(1), [&] {
      clock.t += std::chrono::seconds(1);  // each look at the clock is one second later
      ++reads;
      return clock.t;
    });
    datasets::build_blending_indices({0.5, 0.5}, size, &progress);
    progress.finish();
  });
  EXPECT_EQ(reads, 5);  // start, three reports, finish
  EXPECT_EQ(out,
            "> blend: 1048576 of 3145728 samples (33%) after 1 s, ETA 2 s\n"
            "> blend: 2097152 of 3145728 samples (66%) after 2 s, ETA 1 s\n"
            "> blend: 3145728 of 3145728 samples (100%) after 3 s, ETA 0 s\n"
            "> blend: done, 3145728 samples in 4.0 s\n");
}

// --load reads a checkpoint one parameter at a time, a progress step each: with a clock one second
// further at each look and a report every second, every tensor gets its line.
TEST(Progress, CheckpointLoadReportsPerTensor) {
  const TrainingArgs args =
      parse_training_args({"--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "4", "--seq-length",
                           "8", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
                           "--tokenizer-type", "NullTokenizer", "--vocab-size", "32"});
  const ParallelContext single = ParallelContext::single_process();
  GPTModel model(args.model, single);
  model.parameters().initialize(1);
  testing::TempDir dir;
  save_weights_checkpoint(dir.path(), args, 1, {model_state(model, Optimizer::StateCopies::one_replica, single)});
  const auto n = int64_t(model.parameters().params().size());
  FakeClock clock;
  const std::string out = run_captured([&] {
    ProgressReporter progress("load", n, "tensors", std::chrono::seconds(1), [&] {
      clock.t += std::chrono::seconds(1);
      return clock.t;
    });
    load_model_weights(dir.path(), model, 0, &progress);
    progress.finish();
  });
  // Tensor k is done k seconds after the start: k of n at 1 tensor/s leaves n - k seconds.
  std::string expected;
  for (int64_t k = 1; k <= n; ++k)
    expected += "> load: " + std::to_string(k) + " of " + std::to_string(n) + " tensors (" +
                std::to_string(int(100.0 * (double(k) / double(n)))) + "%) after " + std::to_string(k) + " s, ETA " +
                std::to_string(n - k) + " s\n";
  expected += "> load: done, " + std::to_string(n) + " tensors in " + std::to_string(n + 1) + ".0 s\n";
  EXPECT_EQ(out, expected);
}

}  // namespace
}  // namespace megatron
