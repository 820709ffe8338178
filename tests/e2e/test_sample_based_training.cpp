// Sample-based training (--train-samples with --lr-*-samples, Megatron's other way to size a
// run): it runs train_samples / GBS iterations, and the scheduler steps by the samples each
// iteration consumed, so the LR logged after iteration k is the schedule's value at k * GBS.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/training/arguments.h"
#include "megatron/training/training.h"
#include "test_util.h"

using namespace megatron;
using megatron::testing::TempDir;

namespace {
// A tiny model on mock data, micro-batch 2, logging every iteration into `metrics`, plus `run`.
std::vector<std::string> tiny_sample_run(const std::string& metrics, std::vector<std::string> run) {
  const std::vector<std::string> model = {"--num-layers",
                                          "2",
                                          "--hidden-size",
                                          "32",
                                          "--num-attention-heads",
                                          "4",
                                          "--seq-length",
                                          "16",
                                          "--micro-batch-size",
                                          "2",
                                          "--mock-data",
                                          "--tokenizer-type",
                                          "NullTokenizer",
                                          "--vocab-size",
                                          "100",
                                          "--log-interval",
                                          "1",
                                          "--metrics-file",
                                          metrics,
                                          "--device",
                                          "cpu"};
  run.insert(run.end(), model.begin(), model.end());
  return run;
}
}  // namespace

// GBS 4, --train-samples 26: 26 / 4 = 6 iterations (Megatron drops the remainder). Linear decay
// over D = 20 samples after W = 6 warmup samples, lr 0.01, min 0.001; the log after iteration k
// shows the LR at 4k samples, worked out by hand (lr = 0.001 + 0.009 c, c = 1 - (s - 6) / 14):
//   k=1, s=4:  warmup, 0.01 * 4 / 6 = 0.006666666666666667
//   k=2, s=8:  c = 12/14, 0.001 + 0.108 / 14 = 0.008714285714285714
//   k=3, s=12: c = 8/14,  0.001 + 0.072 / 14 = 0.006142857142857143
//   k=4, s=16: c = 4/14,  0.001 + 0.036 / 14 = 0.003571428571428571
//   k=5, s=20: c = 0, 0.001;  k=6, s=24 > D: min_lr 0.001
// Relative tolerance 1e-13: decimal hand values against a few double roundings (see
// test_lr_scheduler.cpp); a schedule stepped per iteration instead of per sample is off by far more.
TEST(SampleBasedTraining, RunsTrainSamplesOverGbsIterationsAndStepsTheScheduleBySamples) {
  TempDir dir;
  const std::string metrics = dir / "metrics.jsonl";
  const TrainingArgs args = parse_training_args(
      tiny_sample_run(metrics, {"--global-batch-size", "4", "--train-samples", "26", "--lr", "0.01", "--min-lr",
                                "0.001", "--lr-warmup-samples", "6", "--lr-decay-samples", "20"}));
  const TrainingSummary summary = pretrain(args);
  EXPECT_EQ(summary.iterations_run, 6);

  const std::vector<double> expected = {
      0.006666666666666667, 0.008714285714285714, 0.006142857142857143, 0.003571428571428571, 0.001, 0.001};
  std::ifstream in(metrics);
  size_t k = 0;
  for (std::string line; std::getline(in, line); ++k) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ASSERT_LT(k, expected.size());
    EXPECT_EQ(j.at("iteration"), int64_t(k + 1));
    EXPECT_EQ(j.at("consumed_samples"), int64_t(4 * (k + 1)));
    EXPECT_NEAR(j.at("learning_rate").get<double>(), expected[k], 1e-13 * expected[k]) << "iteration " << k + 1;
  }
  EXPECT_EQ(k, expected.size());
}

// --rampup-batch-size 4 4 30 to GBS 16 over --train-samples 100 (Megatron's formula, worked by
// hand): 3 increments of 10 samples, so the batch is 4 below 10 consumed samples, 8 below 20, 12
// below 30, 16 from 30 on (at exactly 30: 4 + floor(30 / 10) * 4 = 16). The ramp runs while
// consumed <= 30: 4, 4, 4, 8, 12 (32 consumed, 5 iterations), then (100 - 32) / 16 = 4 more at 16:
// 9 iterations, consumed 4, 8, 12, 20, 32, 48, 64, 80, 96. The scheduler steps by each batch:
// linear decay over 60 samples after 6 warmup samples, lr 0.01, min 0.001 (lr = 0.001 + 0.009 c,
// c = 1 - (s - 6) / 54): s=4 warmup 0.04 / 6; s=8 c=52/54; s=12 c=48/54; s=20 c=40/54;
// s=32 c=28/54; s=48 c=12/54; s>60 min_lr. Tolerance as above.
TEST(SampleBasedTraining, RampupBatchSizeFollowsMegatronsFormula) {
  TempDir dir;
  const std::string metrics = dir / "metrics.jsonl";
  const TrainingArgs args = parse_training_args(tiny_sample_run(
      metrics, {"--global-batch-size", "16", "--rampup-batch-size", "4", "4", "30", "--train-samples", "100", "--lr",
                "0.01", "--min-lr", "0.001", "--lr-warmup-samples", "6", "--lr-decay-samples", "60"}));
  EXPECT_EQ(args.total_iterations(), 9);
  const TrainingSummary summary = pretrain(args);
  EXPECT_EQ(summary.iterations_run, 9);
  const std::vector<int64_t> batch = {4, 4, 4, 8, 12, 16, 16, 16, 16};
  const std::vector<int64_t> consumed = {4, 8, 12, 20, 32, 48, 64, 80, 96};
  const std::vector<double> lr = {0.04 / 6,
                                  0.001 + 0.009 * 52 / 54,
                                  0.001 + 0.009 * 48 / 54,
                                  0.001 + 0.009 * 40 / 54,
                                  0.001 + 0.009 * 28 / 54,
                                  0.001 + 0.009 * 12 / 54,
                                  0.001,
                                  0.001,
                                  0.001};
  std::ifstream in(metrics);
  size_t k = 0;
  for (std::string line; std::getline(in, line); ++k) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ASSERT_LT(k, batch.size());
    EXPECT_EQ(j.at("global_batch_size"), batch[k]) << "iteration " << k + 1;
    EXPECT_EQ(j.at("consumed_samples"), consumed[k]) << "iteration " << k + 1;
    EXPECT_NEAR(j.at("learning_rate").get<double>(), lr[k], 1e-13 * lr[k]) << "iteration " << k + 1;
  }
  EXPECT_EQ(k, batch.size());
}
