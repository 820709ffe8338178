// Bad input through the real executable: each case must exit non-zero with a message that
// names the problem.
#include <gtest/gtest.h>
#include <unistd.h>

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

// Mixture of experts: each broken rule is named before any work starts.
TEST(BadInput, MoECombinations) {
  const std::string moe = "train" + kTiny + kMock + " --disable-bias-linear --num-experts 4";
  expect_failure(moe + " --moe-router-topk 5", "--moe-router-topk 5 must lie in [1, --num-experts 4]");
  expect_failure(moe + " --moe-router-enable-expert-bias", "needs --moe-router-score-function sigmoid");
  expect_failure(moe + " --moe-pad-expert-input-to-capacity", "needs --moe-expert-capacity-factor");
  expect_failure(moe + " --moe-layer-freq [1,0,1]", "the list has 3 entries for 2 layers");
  expect_failure("train" + kTiny + kMock + " --num-experts 4", "add --disable-bias-linear");
  expect_failure(moe + " --moe-router-load-balancing-type sinkhorn", "sinkhorn");
  expect_failure(moe + " --expert-model-parallel-size 2",
                 "--expert-model-parallel-size 2 does not divide the data-parallel size 1");
  expect_failure("train" + kTiny + kMock + " --disable-bias-linear --num-experts 3 --expert-model-parallel-size 2",
                 "--num-experts 3 is not divisible by --expert-model-parallel-size 2");
  expect_failure("train" + kTiny + kMock + " --expert-model-parallel-size 2", "add --num-experts N, or drop the flag");
  expect_failure(moe + " --fp16 --expert-model-parallel-size 2", "expert parallelism does not train in fp16");
  expect_failure(moe + " --moe-token-dispatcher-type flex", "--moe-token-dispatcher-type");
  expect_failure(moe + " --expert-tensor-parallel-size 2",
                 "world size 1 is not a multiple of expert TP x EP x PP = 2 x 1 x 1 = 2");
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

// An unusable --save stops the run before any model or data work, not at the first save.
TEST(BadInput, SaveDirectoryIsCheckedBeforeAnyWork) {
  TempDir dir;
  std::ofstream(dir / "file") << "not a directory";
  const auto no_work = [](const megatron::testing::RunResult& r, const std::string& what) {
    EXPECT_EQ(r.output.find("building GPT model"), std::string::npos) << what << ": the model was built first\n"
                                                                      << r.output;
    EXPECT_EQ(r.output.find(" iteration "), std::string::npos) << what << ": training ran first\n" << r.output;
  };
  const std::string run = "train" + kTiny + kMock + " --save-interval 2 --save ";
  const auto file = run_megatron(run + dir / "file");
  EXPECT_NE(file.exit_code, 0);
  EXPECT_NE(file.output.find("--save " + dir / "file" + " exists and is not a directory"), std::string::npos)
      << file.output;
  no_work(file, "a file");
  const auto under_file = run_megatron(run + dir / "file/ckpt");
  EXPECT_NE(under_file.exit_code, 0);
  EXPECT_NE(under_file.output.find("--save " + dir / "file/ckpt" + " cannot be created"), std::string::npos)
      << under_file.output;
  no_work(under_file, "a path under a file");
  if (geteuid() != 0) {  // root writes anywhere
    std::filesystem::create_directory(dir / "read_only");
    std::filesystem::permissions(dir / "read_only",
                                 std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    const auto read_only = run_megatron(run + dir / "read_only");
    EXPECT_NE(read_only.output.find("--save " + dir / "read_only" + " is not writable"), std::string::npos)
        << read_only.output;
    no_work(read_only, "a read-only directory");
  }
  // A missing directory is created up front, as Megatron does: before the data, here missing.
  const auto created = run_megatron("train" + kTiny + " --tokenizer-type ByteTokenizer --data-path " +
                                    dir / "absent_text_document --save-interval 2 --save " + dir / "new/ckpt");
  EXPECT_NE(created.exit_code, 0);
  EXPECT_NE(created.output.find("absent_text_document"), std::string::npos) << created.output;
  EXPECT_TRUE(std::filesystem::is_directory(dir / "new/ckpt"));
}

TEST(BadInput, GenerateRejectsNegativeSamplingValues) {
  // Checked with the flags, before the checkpoint is read.
  expect_failure("generate --load /nonexistent/ckpt --temperature -0.5", "--temperature -0.5 must be >= 0");
  expect_failure("generate --load /nonexistent/ckpt --top-k -1", "--top-k -1 must be >= 0");
  expect_failure("generate --load /nonexistent/ckpt --max-new-tokens -3", "--max-new-tokens -3 must be >= 0");
  expect_failure("generate --load /nonexistent/ckpt --num-samples 0", "--num-samples 0 must be >= 1");
}

// --load takes the run's --save directory; given one checkpoint's iter_* directory, the error says
// to pass the parent (train would otherwise start from scratch).
TEST(BadInput, LoadOfOneCheckpointDirectoryNamesItsParent) {
  TempDir dir;
  const auto ok = run_megatron("train" + kTiny + kMock + " --save " + dir / "ckpt" + " --save-interval 2");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  const std::string advice = "pass its parent, --load " + dir / "ckpt";
  expect_failure("generate --load " + dir / "ckpt/iter_0000002", advice);
  expect_failure("generate --load " + dir / "ckpt/iter_0000002/", advice);
  expect_failure("train" + kShape + kMock + " --train-iters 4 --load " + dir / "ckpt/iter_0000002", advice);
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
