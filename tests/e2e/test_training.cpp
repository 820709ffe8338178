// End-to-end training on the CPU: resume is bit-exact, and the demo-sized model learns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "e2e/e2e_util.h"
#include "megatron/datasets/indexed_dataset.h"
#include "megatron/training/arguments.h"
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
}  // namespace

TEST(Training, ResumeIsBitExact) {
  TempDir dir;
  // Dropout on (masks are counter-based), bf16 compute with fp32 master weights and gradient
  // accumulation over 2 micro-batches: every piece of state must survive the checkpoint.
  // The LR schedule is pinned with --lr-decay-iters so the 10-iteration run schedules like the 20.
  const std::vector<std::string> common = {"--bf16", "--attention-dropout", "0.1", "--hidden-dropout",
                                           "0.1",    "--lr-decay-iters",    "20"};
  const TrainingSummary straight = pretrain(parse_training_args(with(tiny_run("20"), common)));
  ASSERT_EQ(straight.train_losses.size(), 20u);

  const std::string ckpt = dir / "ckpt";
  pretrain(parse_training_args(with(tiny_run("10"), with(common, {"--save", ckpt, "--save-interval", "10"}))));
  const TrainingSummary resumed = pretrain(parse_training_args(with(tiny_run("20"), with(common, {"--load", ckpt}))));
  ASSERT_EQ(resumed.train_losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i)
    EXPECT_TRUE(bit_equal(straight.train_losses[10 + i], resumed.train_losses[i]))
        << "iteration " << 11 + i << ": " << straight.train_losses[10 + i] << " vs " << resumed.train_losses[i];
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
