// Every tokenizer `megatron train` accepts travels inside its checkpoint: once the checkpoint
// directory is moved and the tokenizer's own files are gone, `generate` and `train --load` rebuild
// the same tokenizer from the checkpoint's copy without a tokenizer flag.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "e2e/e2e_util.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_io.h"
#include "megatron/training/training.h"
#include "tiktoken_vocab.h"
#include "unit/sentencepiece_test_model.h"
#include "unit/test_tokenizer_fixtures.h"

using namespace megatron;
using megatron::testing::error_of;
using megatron::testing::run_megatron;
using megatron::testing::TempDir;
using megatron::testing::tokenizer_fixture;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> tiny_run(int64_t iters, const std::vector<std::string>& more) {
  std::vector<std::string> argv = {"--num-layers",
                                   "1",
                                   "--hidden-size",
                                   "16",
                                   "--num-attention-heads",
                                   "2",
                                   "--seq-length",
                                   "16",
                                   "--micro-batch-size",
                                   "1",
                                   "--global-batch-size",
                                   "1",
                                   "--train-iters",
                                   std::to_string(iters),
                                   "--lr",
                                   "1e-3",
                                   "--mock-data",
                                   "--save-interval",
                                   "2",
                                   "--log-interval",
                                   "1",
                                   "--device",
                                   "cpu"};
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

// One tokenizer type: its flags, naming files it writes into `dir` under names that are not the
// ones a checkpoint gives them, and text it can encode.
struct TokenizerCase {
  std::string type;
  std::string text;
};

void PrintTo(const TokenizerCase& c, std::ostream* os) { *os << c.type; }

std::vector<std::string> write_tokenizer(const std::string& type, const std::string& dir) {
  const auto copy = [&](const std::string& fixture, const std::string& name) {
    fs::copy_file(tokenizer_fixture(fixture), dir + "/" + name);
    return dir + "/" + name;
  };
  if (type == "GPT2BPETokenizer")
    return {"--tokenizer-type", type,
            "--vocab-file",     copy("gpt2/vocab.json", "gpt2-vocab.json"),
            "--merge-file",     copy("gpt2/merges.txt", "gpt2-merges.txt")};
  if (type == "HuggingFaceTokenizer") {
    // The directory, holding tokenizer_config.json too: LLaMA-3's eos and bos come from it.
    copy("llama3/tokenizer.json", "tokenizer.json");
    copy("llama3/tokenizer_config.json", "tokenizer_config.json");
    return {"--tokenizer-type", type, "--tokenizer-model", dir};
  }
  if (type == "TikTokenizer") {
    // The 256 bytes and 24 longer tokens, "oW" among them, which the v1 pattern keeps inside
    // "HelloWorld" and v2 cuts apart; Megatron's options all given unlike its defaults, so the
    // checkpoint must keep them.
    std::vector<std::string> longer = {"oW"};
    for (int k = 0; k < 23; ++k) longer.push_back("z" + std::to_string(k));
    const nlohmann::json vocab = megatron::testing::tiktoken_vocabulary(longer);
    std::ofstream(dir + "/megatron-vocab.json") << vocab.dump();
    return {"--tokenizer-type",
            type,
            "--tokenizer-model",
            dir + "/megatron-vocab.json",
            "--vocab-size",
            "300",
            "--tiktoken-num-special-tokens",
            "20",
            "--tiktoken-pattern",
            "v1",
            "--special-tokens",
            "<unk>",
            "<s>",
            "</s>",
            "<mask>",
            "<pad>",
            "<cls>",
            "<sep>",
            "<x>"};
  }
  if (type == "NullTokenizer") return {"--tokenizer-type", type, "--vocab-size", "100"};
  if (type == "ByteTokenizer") return {"--tokenizer-type", type};
  std::ofstream(dir + "/sp.model", std::ios::binary) << megatron::testing::sentencepiece_model_proto();
  return {"--tokenizer-type", type, "--tokenizer-model", dir + "/sp.model"};
}

void expect_same_tokenizer(const datasets::Tokenizer& a, const datasets::Tokenizer& b, const std::string& text) {
  EXPECT_EQ(a.name(), b.name());
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.eod(), b.eod());
  EXPECT_EQ(a.bos(), b.bos());
  EXPECT_EQ(a.special_tokens(), b.special_tokens());
  const std::vector<int32_t> ids = a.encode(text);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(b.encode(text), ids);
  EXPECT_EQ(b.decode(ids), a.decode(ids));
}

class CheckpointTokenizer : public ::testing::TestWithParam<TokenizerCase> {};

TEST_P(CheckpointTokenizer, TravelsWithTheCheckpoint) {
  const TokenizerCase& c = GetParam();
  TempDir work;
  const std::string source = work / "tokenizer", ckpt = work / "ckpt", moved = work / "elsewhere";
  fs::create_directory(source);
  const std::vector<std::string> flags = write_tokenizer(c.type, source);
  const TrainingArgs trained = parse_training_args(tiny_run(2, flags));
  const auto original = datasets::make_tokenizer(trained.tokenizer);
  pretrain(parse_training_args(tiny_run(2, [&] {
    std::vector<std::string> f = flags;
    f.insert(f.end(), {"--save", ckpt});
    return f;
  }())));
  for (const datasets::TokenizerFile& file : original->files())
    EXPECT_TRUE(fs::is_regular_file(ckpt + "/iter_0000002/" + file.name)) << file.name;

  // Another machine: the checkpoint elsewhere, the tokenizer's files gone.
  fs::rename(ckpt, moved);
  fs::remove_all(source);
  const TrainingArgs restored_args = read_checkpoint_args(moved);
  const auto restored = datasets::make_tokenizer(restored_args.tokenizer);
  expect_same_tokenizer(*original, *restored, c.text);
  for (const datasets::TokenizerFile& file : restored->files())
    EXPECT_EQ(fs::path(file.path).parent_path(), fs::path(moved + "/iter_0000002")) << file.path;

  const megatron::testing::RunResult generated = run_megatron("generate --load " + moved + " --prompt '" + c.text +
                                                              "' --max-new-tokens 3 --temperature 0 --device cpu");
  EXPECT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_NE(generated.output.find("----- sample 1 -----\n" + c.text), std::string::npos) << generated.output;

  // Resuming needs no tokenizer flag either, and its checkpoint keeps the tokenizer.
  const TrainingSummary resumed = pretrain(parse_training_args(tiny_run(4, {"--load", moved, "--save", moved})));
  EXPECT_EQ(resumed.iterations_run, 2);
  expect_same_tokenizer(*original, *datasets::make_tokenizer(read_checkpoint_args(moved).tokenizer), c.text);
}

INSTANTIATE_TEST_SUITE_P(EveryType, CheckpointTokenizer,
                         ::testing::Values(TokenizerCase{"GPT2BPETokenizer", "Hello world, said the fox."},
                                           TokenizerCase{"HuggingFaceTokenizer", "Hello world, said the fox."},
                                           TokenizerCase{"SentencePieceTokenizer", "hello world"},
                                           TokenizerCase{"GPTSentencePieceTokenizer", "hello world"},
                                           TokenizerCase{"Llama2Tokenizer", "hello world"},
                                           TokenizerCase{"ByteTokenizer", "Hi there"},
                                           TokenizerCase{"TikTokenizer", "HelloWorld<x>"},
                                           TokenizerCase{"NullTokenizer", "7 8 9"}),
                         [](const auto& param_info) { return param_info.param.type; });

// Tokenizer flags given with --load complete or replace the checkpoint's, as Megatron's command
// line overrides a checkpoint's arguments; generate checks a replacement against the model.
TEST(CheckpointTokenizerFlags, OverrideTheSavedTokenizer) {
  TempDir work;
  const std::string source = work / "tokenizer", ckpt = work / "ckpt";
  fs::create_directory(source);
  const std::vector<std::string> flags = write_tokenizer("GPT2BPETokenizer", source);
  std::vector<std::string> save = flags;
  save.insert(save.end(), {"--save", ckpt});
  pretrain(parse_training_args(tiny_run(2, save)));

  // The type alone: the files are the checkpoint's.
  const TrainingArgs typed = parse_training_args(tiny_run(4, {"--load", ckpt, "--tokenizer-type", "GPT2BPETokenizer"}));
  EXPECT_EQ(typed.tokenizer.vocab_file, ckpt + "/iter_0000002/vocab.json");
  EXPECT_EQ(typed.tokenizer.merge_file, ckpt + "/iter_0000002/merges.txt");
  // One file given: that one replaces the saved copy.
  const std::string merges = source + "/gpt2-merges.txt";
  const TrainingArgs one = parse_training_args(tiny_run(4, {"--load", ckpt, "--merge-file", merges}));
  EXPECT_EQ(one.tokenizer.merge_file, merges);
  EXPECT_EQ(one.tokenizer.vocab_file, ckpt + "/iter_0000002/vocab.json");
  // A whole tokenizer given: the checkpoint's is not read at all.
  std::vector<std::string> full = flags;
  full.insert(full.end(), {"--load", ckpt});
  EXPECT_EQ(parse_training_args(tiny_run(4, full)).tokenizer.vocab_file, source + "/gpt2-vocab.json");
  // Another type replaces it; the model's vocabulary no longer fits, which --load reports.
  const TrainingArgs other =
      parse_training_args(tiny_run(4, {"--load", ckpt, "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"}));
  EXPECT_EQ(other.tokenizer.type, "NullTokenizer");
  EXPECT_TRUE(other.tokenizer.vocab_file.empty());
  EXPECT_NE(error_of([&] { pretrain(other); }).find("has a padded vocabulary of 50304 rows"), std::string::npos);

  const std::string generate = "generate --load " + ckpt + " --prompt 'Hello' --max-new-tokens 2 --device cpu ";
  const megatron::testing::RunResult same =
      run_megatron(generate + "--tokenizer-type GPT2BPETokenizer --merge-file " + merges);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  const megatron::testing::RunResult wrong = run_megatron(generate + "--tokenizer-type NullTokenizer --vocab-size 100");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("make a NullTokenizer of 100 tokens, but the model of " + ckpt +
                              " was trained with 50257 (GPT2BPETokenizer); drop the tokenizer flags"),
            std::string::npos)
      << wrong.output;
}

}  // namespace
