// Bad input through the real executable: each case must exit non-zero with a message that
// names the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "e2e/e2e_util.h"

using megatron::testing::run_megatron;
using megatron::testing::TempDir;

namespace {
const std::string kShape =
    " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    " --lr 1e-3 --log-interval 1 --device cpu";
const std::string kTiny = kShape + " --train-iters 2";
const std::string kMock = " --mock-data --tokenizer-type NullTokenizer --vocab-size 64";

void expect_failure(const std::string& args, const std::string& needle) {
  const auto r = run_megatron(args);
  EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.output;
}

void write_jsonl(const std::string& path) {
  std::ofstream out(path);
  for (int i = 0; i < 50; ++i)
    out << R"({"text": "document number )" << i << R"( has some words in it."})"
        << "\n";
}

void flip_byte(const std::string& path, std::streamoff offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.get(c);
  f.seekp(offset);
  f.put(char(c ^ 0x20));
}
}  // namespace

TEST(BadInput, UnknownFlagSuggestsTheRightOne) {
  expect_failure("train --num-layerz 2" + kTiny + kMock, "--num-layers");
}

TEST(BadInput, HeadsMustDivideHidden) {
  expect_failure(
      "train --num-layers 2 --hidden-size 30 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
      " --train-iters 2 --lr 1e-3" +
          kMock,
      "--num-attention-heads");
}

TEST(BadInput, NonexistentDataPath) {
  expect_failure("train" + kTiny + " --data-path /nonexistent/corpus_text_document --tokenizer-type ByteTokenizer",
                 "/nonexistent/corpus_text_document");
}

TEST(BadInput, TruncatedIndexFile) {
  TempDir dir;
  write_jsonl(dir / "in.jsonl");
  const auto pre = run_megatron("preprocess-data --input " + dir / "in.jsonl" + " --output-prefix " + dir / "c" +
                                " --tokenizer-type ByteTokenizer --append-eod --workers 1");
  ASSERT_EQ(pre.exit_code, 0) << pre.output;
  const std::string idx = dir / "c_text_document.idx";
  std::filesystem::resize_file(idx, std::filesystem::file_size(idx) - 7);
  expect_failure("train" + kTiny + " --data-path " + dir / "c_text_document" + " --tokenizer-type ByteTokenizer",
                 "c_text_document.idx");
}

TEST(BadInput, CheckpointWithFlippedByte) {
  TempDir dir;
  const auto ok = run_megatron("train" + kTiny + kMock + " --save " + dir / "ckpt" + " --save-interval 2");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  const std::string model_file = dir / "ckpt/iter_0000002/model_rank_00000.safetensors";
  ASSERT_TRUE(std::filesystem::exists(model_file));
  flip_byte(model_file, std::streamoff(std::filesystem::file_size(model_file) / 2));
  expect_failure("train" + kShape + kMock + " --train-iters 4 --load " + dir / "ckpt", "model_rank_00000.safetensors");
  expect_failure("generate --load " + dir / "ckpt", "model_rank_00000.safetensors");
}

TEST(BadInput, GenerateTensorParallelWithoutLaunchedRanks) {
  TempDir dir;
  const auto ok = run_megatron("train" + kTiny + kMock + " --save " + dir / "ckpt" + " --save-interval 2");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  expect_failure("generate --load " + dir / "ckpt" + " --tensor-model-parallel-size 2",
                 "--tensor-model-parallel-size 2 differs from the 1 launched rank(s)");
  expect_failure("generate --load " + dir / "ckpt" + " --tensor-model-parallel-size 0",
                 "--tensor-model-parallel-size 0 must be positive");
}

TEST(BadInput, LoadWithoutCheckpointForGenerate) {
  expect_failure("generate --load /nonexistent/ckpt", "/nonexistent/ckpt");
}

// Two processes of a launcher MPI cannot join would each train alone into the same --save; the
// binary must stop before any work, naming the launcher and `mpirun -np 2`.
TEST(BadInput, LauncherThatMpiCannotJoin) {
  const std::vector<std::vector<std::pair<const char*, const char*>>> launches = {
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"TORCHELASTIC_RUN_ID", "none"}},
      {{"SLURM_JOB_ID", "7"},
       {"SLURM_STEP_ID", "0"},
       {"SLURM_PROCID", "1"},
       {"SLURM_STEP_NUM_TASKS", "2"},
       {"SLURM_LOCALID", "1"}},
      {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"PMI_FD", "9"}}};
  for (const auto& env : launches) {
    TempDir dir;
    for (const auto& [name, value] : env) setenv(name, value, 1);
    const auto r = run_megatron("train" + kTiny + kMock + " --save " + dir / "ckpt" + " --save-interval 1");
    for (const auto& [name, value] : env) unsetenv(name);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("started this process as rank 1 of 2"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("`mpirun -np 2 megatron"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("iteration"), std::string::npos) << "it trained:\n" << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "ckpt")) << r.output;
  }
}
