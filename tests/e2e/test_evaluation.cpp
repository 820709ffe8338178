// Evaluation after training, as Megatron's pretrain does it: the validation split once more and
// the test split (--split's third weight, or --test-data-path), eval_iters global batches each,
// the test split read from its start. The test loss must be that of the trained model on test
// samples 0 .. eval_iters * GBS - 1, here recomputed another way: the test dataset built on its
// own, those samples stacked into one batch (no loader, no micro-batches) and evaluated by the
// weights the run saved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "megatron/datasets/blended_dataset.h"
#include "megatron/datasets/indexed_dataset.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_io.h"
#include "megatron/training/metrics.h"
#include "megatron/training/training.h"
#include "test_util.h"

using namespace megatron;
using megatron::testing::TempDir;

namespace {

// 300 documents of 6-20 tokens with a learnable pattern, EOD (99) last.
std::string write_corpus(const TempDir& dir) {
  const std::string prefix = dir / "docs";
  datasets::IndexedDatasetBuilder builder(prefix, datasets::IndexDType::u16);
  for (int d = 0; d < 300; ++d) {
    std::vector<int32_t> ids;
    for (int t = 0; t < 5 + d % 15; ++t) ids.push_back((d * 7 + t * 3) % 99);
    ids.push_back(99);
    builder.add_document(ids);
  }
  builder.finalize();
  return prefix;
}

// 4 iterations of 2 micro-batches of 2; validation every 2 iterations; 3 global batches (12
// samples) per evaluation.
std::vector<std::string> run_argv(const std::vector<std::string>& data, const std::string& save) {
  std::vector<std::string> argv = {"--num-layers",
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
                                   "4",
                                   "--lr",
                                   "1e-2",
                                   "--tokenizer-type",
                                   "NullTokenizer",
                                   "--vocab-size",
                                   "100",
                                   "--eval-interval",
                                   "2",
                                   "--eval-iters",
                                   "3",
                                   "--save",
                                   save,
                                   "--save-interval",
                                   "4",
                                   "--metrics-file",
                                   save + ".jsonl",
                                   "--device",
                                   "cpu"};
  argv.insert(argv.end(), data.begin(), data.end());
  return argv;
}

// The loss of the saved model on samples [0, n) of the test split the arguments describe.
double test_loss_recomputed(const TrainingArgs& args, int64_t n) {
  datasets::GPTDataConfig config;
  config.data_path = args.data.data_path;
  config.test_data_path = args.data.test_data_path;
  config.split = args.data.split;
  config.seq_length = args.model.seq_length;
  config.seed = args.seed;
  const auto test = datasets::build_gpt_dataset(config, datasets::Split::test, n);
  std::vector<int64_t> indices(static_cast<size_t>(n));
  std::iota(indices.begin(), indices.end(), 0);
  const datasets::Batch batch = datasets::make_batch(*test, indices, datasets::BatchOptions{.eod = 99});
  const ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(args.model, ctx);
  load_model_weights(args.save, model);
  const LossSums sums = model.evaluate(batch.tokens, batch.labels, batch.loss_mask, batch.position_ids);
  return sums.loss_sum / sums.num_tokens;
}

std::vector<nlohmann::json> evaluation_lines(const std::string& metrics_file) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(metrics_file);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("kind") != "train") lines.push_back(std::move(j));
  }
  return lines;
}

// Tolerance of the recomputed loss, relative: the same weights on the same tokens, batched
// differently (6 micro-batches of 2 against one of 12), so only float rounding in the batched
// kernels and the grouping of the sums differ: measured 3.4e-8, a couple of units of float's
// 6e-8. 1e-6 keeps a 30x margin and is thousands of times smaller than the change two batches
// fewer make (7e-3, printed below).
constexpr double kTolerance = 1e-6;

}  // namespace

TEST(Evaluation, TestSplitIsEvaluatedAfterTrainingOnEvalItersBatches) {
  TempDir dir;
  const TrainingArgs args =
      parse_training_args(run_argv({"--data-path", write_corpus(dir), "--split", "80,10,10"}, dir / "ckpt"));
  const TrainingSummary summary = pretrain(args);
  ASSERT_TRUE(summary.test_loss.has_value());
  EXPECT_EQ(summary.test_samples, 12);         // eval_iters * GBS
  EXPECT_EQ(summary.valid_losses.size(), 2u);  // iterations 2 and 4
  EXPECT_TRUE(summary.end_valid_loss.has_value());

  const double expected = test_loss_recomputed(args, 12);
  EXPECT_NEAR(*summary.test_loss, expected, kTolerance * expected);
  // The test loss tells its samples apart: two batches fewer is another number.
  const double fewer = test_loss_recomputed(args, 4);
  std::printf("test loss %.9f, recomputed %.9f, on 4 samples %.9f\n", *summary.test_loss, expected, fewer);
  EXPECT_GT(std::abs(fewer - expected), 100 * kTolerance * expected);

  // The metrics file: the periodic validations, then validation and test after training.
  const std::vector<nlohmann::json> lines = evaluation_lines(args.metrics_file);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].at("iteration"), 2);
  EXPECT_FALSE(lines[1].contains("end_of_training"));
  EXPECT_EQ(lines[2].at("kind"), "validation");
  EXPECT_EQ(lines[2].at("end_of_training"), true);
  EXPECT_EQ(lines[2].at("lm_loss").get<double>(), *summary.end_valid_loss);
  EXPECT_EQ(lines[3].at("kind"), "test");
  EXPECT_EQ(lines[3].at("iteration"), 4);
  EXPECT_EQ(lines[3].at("samples"), 12);
  EXPECT_EQ(lines[3].at("lm_loss").get<double>(), *summary.test_loss);
}

TEST(Evaluation, TestDataPathIsEvaluatedAfterTraining) {
  TempDir dir;
  const std::string corpus = write_corpus(dir);
  const TrainingArgs args = parse_training_args(
      run_argv({"--train-data-path", corpus, "--valid-data-path", corpus, "--test-data-path", corpus}, dir / "ckpt"));
  const TrainingSummary summary = pretrain(args);
  ASSERT_TRUE(summary.test_loss.has_value());
  EXPECT_EQ(summary.test_samples, 12);
  const double expected = test_loss_recomputed(args, 12);
  EXPECT_NEAR(*summary.test_loss, expected, kTolerance * expected);
}

TEST(Evaluation, NoTestEvaluationWithoutATestSplit) {
  TempDir dir;
  const TrainingArgs args =
      parse_training_args(run_argv({"--data-path", write_corpus(dir), "--split", "80,20,0"}, dir / "ckpt"));
  const TrainingSummary summary = pretrain(args);
  EXPECT_FALSE(summary.test_loss.has_value());
  EXPECT_EQ(summary.test_samples, 0);
  EXPECT_TRUE(summary.end_valid_loss.has_value());
  const std::vector<nlohmann::json> lines = evaluation_lines(args.metrics_file);
  ASSERT_EQ(lines.size(), 3u);
  for (const nlohmann::json& line : lines) EXPECT_EQ(line.at("kind"), "validation");
}

// Evaluation runs only with --eval-interval; a test path that would be silently unused is an error.
TEST(Evaluation, EvaluationPathsNeedEvalInterval) {
  std::vector<std::string> argv = run_argv({"--train-data-path", "a", "--test-data-path", "b"}, "ckpt");
  argv.erase(std::find(argv.begin(), argv.end(), "--eval-interval"),
             std::find(argv.begin(), argv.end(), "--eval-iters"));
  EXPECT_NE(megatron::testing::error_of([&] {
              parse_training_args(argv);
            }).find("--valid-data-path and --test-data-path are evaluated only with --eval-interval N"),
            std::string::npos);
}

// Megatron's evaluate_and_print_results: the line, with its trailing space, between dashes one
// longer than it (len(string) + 1); PPL = exp(min(20, loss)), e^2 = 7.389056.
TEST(Evaluation, PrintsMegatronsLine) {
  const std::string line =
      " validation loss at iteration 4 on test set | lm loss value: 2.000000E+00 | lm loss PPL: "
      "7.389056E+00 | ";
  const std::string dashes(line.size() + 1, '-');
  EXPECT_EQ(format_validation_line("iteration 4 on test set", 2.0), dashes + "\n" + line + "\n" + dashes);
}
