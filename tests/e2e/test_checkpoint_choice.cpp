// Which checkpoint `megatron train --load` resumes from, through the real executable: never
// from scratch over existing checkpoints, never silently from an older one, and never a fresh
// run's saves over another run's checkpoints.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "e2e/e2e_util.h"

using megatron::testing::run_megatron;
using megatron::testing::TempDir;
namespace fs = std::filesystem;

namespace {
const std::string kRun =
    "train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    " --lr 1e-3 --log-interval 1 --device cpu --mock-data --tokenizer-type NullTokenizer --vocab-size 64"
    " --save-interval 2";

std::string read_all(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A --save directory holding iterations 2, 4 and 6.
std::string six_iterations(const TempDir& dir) {
  const std::string ckpt = dir / "ckpt";
  const auto r = run_megatron(kRun + " --train-iters 6 --save " + ckpt);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return ckpt;
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Iterations the run trained, from its log lines ("iteration        5/       8").
bool trained_iteration(const std::string& output, int iteration, int of) {
  char line[64];
  std::snprintf(line, sizeof line, "iteration %8d/%8d", iteration, of);
  return contains(output, line);
}
}  // namespace

// The tracker is gone (as the old error for a garbled tracker advised): resume from the newest
// checkpoint, not from scratch over them.
TEST(CheckpointChoice, WithoutTrackerResumesFromTheNewest) {
  TempDir dir;
  const std::string ckpt = six_iterations(dir);
  fs::remove(ckpt + "/latest_checkpointed_iteration.txt");
  const std::string iter2 = read_all(ckpt + "/iter_0000002/model_rank_00000.safetensors");
  const auto r = run_megatron(kRun + " --train-iters 8 --load " + ckpt + " --save " + ckpt);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      contains(r.output, "has no latest_checkpointed_iteration.txt; loading its newest checkpoint, iteration 6"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "loaded checkpoint from " + ckpt + " at iteration 6")) << r.output;
  EXPECT_FALSE(trained_iteration(r.output, 1, 8)) << "trained from scratch:\n" << r.output;
  EXPECT_TRUE(trained_iteration(r.output, 7, 8)) << r.output;
  EXPECT_EQ(read_all(ckpt + "/latest_checkpointed_iteration.txt"), "8");
  EXPECT_EQ(read_all(ckpt + "/iter_0000002/model_rank_00000.safetensors"), iter2) << "an old checkpoint was rewritten";
}

// The newest checkpoint is corrupt: refuse, naming the earlier complete ones and --ckpt-step,
// with or without the tracker; --ckpt-step then resumes from the one chosen.
TEST(CheckpointChoice, CorruptNewestIsRefusedAndCkptStepChoosesAnother) {
  TempDir dir;
  const std::string ckpt = six_iterations(dir);
  const std::string metadata = ckpt + "/iter_0000006/metadata.json";
  std::string bytes = read_all(metadata);
  bytes[bytes.size() / 2] = char(bytes[bytes.size() / 2] ^ 0x01);
  std::ofstream(metadata, std::ios::binary) << bytes;
  for (const bool tracker : {true, false}) {
    if (!tracker) fs::remove(ckpt + "/latest_checkpointed_iteration.txt");
    const auto r = run_megatron(kRun + " --train-iters 8 --load " + ckpt + " --save " + ckpt);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "the checkpoint of iteration 6 in " + ckpt)) << r.output;
    EXPECT_TRUE(contains(r.output, tracker ? "(named by its tracker)" : "(its newest, as it has no tracker)"))
        << r.output;
    EXPECT_TRUE(contains(r.output, "complete checkpoints in " + ckpt +
                                       ": iterations 2, 4; load one with --ckpt-step N, "
                                       "e.g. --ckpt-step 4"))
        << r.output;
    EXPECT_FALSE(trained_iteration(r.output, 1, 8)) << r.output;
    EXPECT_FALSE(contains(r.output, "delete")) << r.output;
  }
  const auto r = run_megatron(kRun + " --train-iters 8 --load " + ckpt + " --ckpt-step 4 --save " + ckpt);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "loaded checkpoint from " + ckpt + " at iteration 4")) << r.output;
  EXPECT_TRUE(trained_iteration(r.output, 5, 8)) << r.output;
  EXPECT_FALSE(trained_iteration(r.output, 4, 8)) << r.output;
}

TEST(CheckpointChoice, CkptStepMustNameASavedIteration) {
  TempDir dir;
  const std::string ckpt = six_iterations(dir);
  const auto r = run_megatron(kRun + " --train-iters 8 --load " + ckpt + " --ckpt-step 3");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, ckpt + " has no checkpoint of iteration 3 (chosen by --ckpt-step)")) << r.output;
  EXPECT_TRUE(contains(r.output, "iterations 2, 4, 6")) << r.output;
}

TEST(CheckpointChoice, GarbledTrackerNamesTheWayOut) {
  TempDir dir;
  const std::string ckpt = six_iterations(dir);
  std::ofstream(ckpt + "/latest_checkpointed_iteration.txt") << "six";
  const auto r = run_megatron(kRun + " --train-iters 8 --load " + ckpt + " --save " + ckpt);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "latest_checkpointed_iteration.txt' holds \"six\"")) << r.output;
  EXPECT_TRUE(contains(r.output, "iterations 2, 4, 6; load one with --ckpt-step N")) << r.output;
  EXPECT_FALSE(contains(r.output, "delete")) << r.output;
  const auto chosen = run_megatron(kRun + " --train-iters 8 --load " + ckpt + " --ckpt-step 6 --save " + ckpt);
  EXPECT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_TRUE(contains(chosen.output, "at iteration 6")) << chosen.output;
}

// A fresh run (no --load, or --load elsewhere) into a --save directory that holds checkpoints,
// with or without its tracker, would replace them: refused before any work.
TEST(CheckpointChoice, FreshRunDoesNotOverwriteAnotherRunsCheckpoints) {
  TempDir dir;
  const std::string ckpt = six_iterations(dir);
  const std::string iter2 = read_all(ckpt + "/iter_0000002/model_rank_00000.safetensors");
  for (const bool tracker : {true, false}) {
    if (!tracker) fs::remove(ckpt + "/latest_checkpointed_iteration.txt");
    for (const std::string& load : {std::string(), " --load " + dir / "elsewhere"}) {
      const auto r = run_megatron(kRun + " --train-iters 4 --save " + ckpt + load);
      EXPECT_NE(r.exit_code, 0) << r.output;
      EXPECT_TRUE(contains(r.output, "--save " + ckpt + " already holds checkpoints (iterations 2, 4, 6)")) << r.output;
      EXPECT_TRUE(contains(r.output, "pass --load " + ckpt)) << r.output;
      EXPECT_FALSE(trained_iteration(r.output, 1, 4)) << r.output;
    }
  }
  EXPECT_EQ(read_all(ckpt + "/iter_0000002/model_rank_00000.safetensors"), iter2);
  // Resuming from it is what --save into it is for: --load the same directory, spelled differently.
  const auto resumed = run_megatron(kRun + " --train-iters 8 --save " + ckpt + " --load " + ckpt + "/.");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(trained_iteration(resumed.output, 7, 8)) << resumed.output;
}

// generate reads the same choice: the newest checkpoint without a tracker, or --ckpt-step.
TEST(CheckpointChoice, GenerateWithoutTrackerAndWithCkptStep) {
  TempDir dir;
  const std::string ckpt = six_iterations(dir);
  fs::remove(ckpt + "/latest_checkpointed_iteration.txt");
  const std::string flags = " --prompt \"1 2 3\" --max-new-tokens 4 --device cpu";
  const auto newest = run_megatron("generate --load " + ckpt + flags);
  EXPECT_EQ(newest.exit_code, 0) << newest.output;
  EXPECT_TRUE(contains(newest.output, "loading its newest checkpoint, iteration 6")) << newest.output;
  const auto chosen = run_megatron("generate --load " + ckpt + " --ckpt-step 2" + flags);
  EXPECT_EQ(chosen.exit_code, 0) << chosen.output;
  const auto missing = run_megatron("generate --load " + ckpt + " --ckpt-step 5" + flags);
  EXPECT_NE(missing.exit_code, 0) << missing.output;
  EXPECT_TRUE(contains(missing.output, "has no checkpoint of iteration 5")) << missing.output;
}
