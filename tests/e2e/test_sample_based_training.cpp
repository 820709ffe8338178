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
  const TrainingArgs args = parse_training_args({"--num-layers",
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
                                                 "--train-samples",
                                                 "26",
                                                 "--lr",
                                                 "0.01",
                                                 "--min-lr",
                                                 "0.001",
                                                 "--lr-warmup-samples",
                                                 "6",
                                                 "--lr-decay-samples",
                                                 "20",
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
                                                 "cpu"});
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
