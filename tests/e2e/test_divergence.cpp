// A run that blows up, through the real executable: it must stop with a non-zero exit naming the
// iteration, before that iteration saves anything (Megatron's --check-for-nan-in-loss-and-grad,
// on by default), and a NaN validation loss must never print a perplexity.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "e2e/e2e_util.h"
#include "megatron/checkpointing/checkpoint.h"

using megatron::testing::run_megatron;
using megatron::testing::TempDir;
namespace fs = std::filesystem;

namespace {
const std::string kRun =
    "train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    " --log-interval 1 --device cpu --mock-data --tokenizer-type NullTokenizer --vocab-size 64";

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// The iteration an error names ("iteration 2: found NaN ..."), or -1.
int failed_iteration(const std::string& output) {
  std::smatch m;
  const std::regex pattern("error: iteration ([0-9]+): ");
  return std::regex_search(output, m, pattern) ? std::stoi(m[1]) : -1;
}
}  // namespace

// --lr 1e30: the first update throws the weights to ~1e30 and the next forward is not finite.
// With a save due at the last iteration, nothing may be saved at all.
TEST(Divergence, HugeLearningRateStopsBeforeSaving) {
  for (const std::string precision : {"", " --bf16"}) {
    TempDir dir;
    const auto r =
        run_megatron(kRun + precision + " --lr 1e30 --train-iters 5 --save " + dir / "ckpt" + " --save-interval 5");
    EXPECT_NE(r.exit_code, 0) << r.output;
    const int failed = failed_iteration(r.output);
    EXPECT_GE(failed, 2) << r.output;  // iteration 1 starts from the finite initial weights
    EXPECT_LE(failed, 5) << r.output;
    EXPECT_TRUE(contains(r.output, "found NaN") || contains(r.output, "found Inf")) << r.output;
    // --save itself is created (and probed) before any work; no checkpoint may appear in it.
    EXPECT_TRUE(fs::is_empty(dir / "ckpt")) << "a checkpoint of the broken model was written:\n" << r.output;
  }
}

// Saving every iteration: the checkpoints stop before the iteration the error names.
TEST(Divergence, CheckpointsStopBeforeTheFailedIteration) {
  TempDir dir;
  const std::string ckpt = dir / "ckpt";
  const auto r = run_megatron(kRun + " --bf16 --lr 1e30 --train-iters 5 --save " + ckpt + " --save-interval 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  const int failed = failed_iteration(r.output);
  ASSERT_GE(failed, 2) << r.output;
  std::vector<int64_t> expected;
  for (int64_t i = 1; i < failed; ++i) expected.push_back(i);
  EXPECT_EQ(megatron::checkpointing::list_checkpoints(ckpt), expected) << r.output;
}

// The check off: Megatron's skips, and the run ends normally.
TEST(Divergence, WithoutTheCheckStepsAreSkipped) {
  const auto r = run_megatron(kRun + " --bf16 --lr 1e30 --train-iters 4 --no-check-for-nan-in-loss-and-grad");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "iteration        4/       4")) << r.output;
}

// fp16 keeps its overflow skips while the scale can back off. From 2^40 every step overflows
// (Training.Fp16OverflowSkipsTheStepAndKeepsTheParameters); with the minimum at 2^38 and the
// hysteresis of 2 the scale is 2^40, 2^40, 2^39 for iterations 1-3 (skipped and saved), reaches
// 2^38 after the third, and the fourth overflows at the minimum: stop, naming iteration 4.
TEST(Divergence, Fp16StopsWhenTheMinimumScaleStillOverflows) {
  TempDir dir;
  const std::string ckpt = dir / "ckpt";
  const auto r = run_megatron(kRun +
                              " --lr 1e-3 --fp16 --initial-loss-scale 1099511627776 --min-loss-scale 274877906944"
                              " --train-iters 10 --save " +
                              ckpt + " --save-interval 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "iteration 4: the gradients still overflow at the minimum loss scale")) << r.output;
  EXPECT_EQ(megatron::checkpointing::list_checkpoints(ckpt), (std::vector<int64_t>{1, 2, 3})) << r.output;
  // A static scale cannot back off: its first overflow stops (Megatron keeps the check on there).
  const auto fixed = run_megatron(kRun + " --lr 1e-3 --fp16 --loss-scale 1099511627776 --train-iters 3");
  EXPECT_NE(fixed.exit_code, 0) << fixed.output;
  EXPECT_TRUE(contains(fixed.output, "iteration 1: the gradients overflow at the static loss scale")) << fixed.output;
}

// After the 1e30 step of iteration 1 the validation loss is NaN: with the check the run stops
// there; without it the validation lines print the loss and no perplexity.
TEST(Divergence, NanValidationLossPrintsNoPerplexity) {
  const std::string run = kRun + " --lr 1e30 --train-iters 3 --eval-interval 1 --eval-iters 1 --split 90,10,0";
  const auto r = run_megatron(run);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "iteration 1: found NaN in the validation loss")) << r.output;
  EXPECT_FALSE(contains(r.output, "PPL")) << r.output;

  const auto off = run_megatron(run + " --no-check-for-nan-in-loss-and-grad");
  EXPECT_EQ(off.exit_code, 0) << off.output;
  int validation_lines = 0;
  for (size_t at = off.output.find("validation loss at iteration"); at != std::string::npos;
       at = off.output.find("validation loss at iteration", at + 1)) {
    const std::string line = off.output.substr(at, off.output.find('\n', at) - at);
    EXPECT_TRUE(contains(line, "lm loss value: ")) << line;
    EXPECT_FALSE(contains(line, "PPL")) << line;
    ++validation_lines;
  }
  // One per iteration, then the end of training's validation and test lines (mock data always has
  // every split).
  EXPECT_EQ(validation_lines, 5) << off.output;
}
