// BPE training: merges checked by hand on tiny corpora, determinism across thread counts, and
// the written tokenizer.json read back by HuggingFaceTokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/datasets/tokenizers/bpe_trainer.h"
#include "megatron/datasets/tokenizers/hf_tokenizer.h"
#include "megatron/datasets/tokenizers/train_tokenizer.h"
#include "megatron/flags/flag_table.h"
#include "test_tokenizer_fixtures.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;
using megatron::testing::repo_root;
using megatron::testing::TempDir;

namespace {

BpeModel train(const std::vector<std::string_view>& docs, int64_t vocab_size, int64_t min_frequency = 2) {
  BpeTrainOptions options;
  options.vocab_size = vocab_size;
  options.min_frequency = min_frequency;
  return train_bpe(count_words(docs, 2), options);
}

std::vector<std::string> merged_tokens(const BpeModel& model) {
  return {model.tokens.begin() + 256, model.tokens.end()};
}

}  // namespace

// Words: "ab" 1, " ab" 2, "abc" 1. (a,b) occurs 4 times, then (" ", ab) 2 times; (ab, c) once
// is below the minimum frequency, so training stops short of the size asked for.
TEST(BpeTrainer, MergesTheMostFrequentPair) {
  const BpeModel model = train({"ab ab ab", "abc"}, 1000);
  EXPECT_EQ(merged_tokens(model), (std::vector<std::string>{"ab", " ab"}));
  EXPECT_EQ(model.tokens.size(), 258u);
  EXPECT_EQ(model.tokens[0], "!");  // ids 0-255 in GPT-2's order
  EXPECT_EQ(model.tokens[220], " ");
  EXPECT_EQ(merged_tokens(train({"ab ab ab", "abc"}, 258)), std::vector<std::string>{"ab"});
}

// All pairs of "xy yx" occur once: ties go to the smallest (left id, right id).
TEST(BpeTrainer, TiesGoToTheSmallestPair) {
  EXPECT_EQ(merged_tokens(train({"xy yx"}, 1000, 1)), (std::vector<std::string>{"xy", "yx", " yx"}));
}

TEST(BpeTrainer, SameModelForAnyThreadCount) {
  std::vector<std::string> texts;
  for (const auto& e : std::filesystem::directory_iterator(repo_root() / "src" / "megatron" / "datasets")) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path());
    std::ostringstream s;
    s << in.rdbuf();
    texts.push_back(s.str());
  }
  const std::vector<std::string_view> docs(texts.begin(), texts.end());
  BpeTrainOptions options;
  options.vocab_size = 600;
  const std::string one = bpe_tokenizer_json(train_bpe(count_words(docs, 1), options));
  const std::string three = bpe_tokenizer_json(train_bpe(count_words(docs, 3), options));
  EXPECT_EQ(one, three);
}

TEST(BpeTrainer, WrittenTokenizerReadsBack) {
  const TempDir dir;
  {
    std::ofstream out(dir / "corpus.jsonl");
    for (int k = 0; k < 200; ++k) {
      out << R"({"text": "The tokenizer learns \u00e9t\u00e9 words )" << k % 7
          << R"(, don't you think? \ud83e\udd17", "other": "zzz"})"
          << "\n";
    }
  }
  std::ostringstream log;
  const TrainTokenizerOptions options = train_tokenizer_flags().parse(
      {"--input", dir / "corpus.jsonl", "--vocab-size=300", "--output", dir / "tokenizer.json", "--workers", "2"});
  const TrainTokenizerReport report = train_tokenizer(options, log);
  EXPECT_EQ(report.documents, 200);
  EXPECT_EQ(report.vocab_size, 300);
  EXPECT_NE(log.str().find("wrote " + dir / "tokenizer.json"), std::string::npos) << log.str();

  const HuggingFaceTokenizer tok(dir / "tokenizer.json");
  EXPECT_EQ(tok.vocab_size(), 300);
  EXPECT_EQ(tok.eod(), 299);
  const std::string text = "The tokenizer learns \xC3\xA9t\xC3\xA9 words 3, don't you think? \xF0\x9F\xA4\x97";
  const std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 3);  // frequent words became single tokens
  EXPECT_EQ(tok.encode("x<|endoftext|>"), (std::vector<int32_t>{tok.encode("x")[0], 299}));
  EXPECT_FALSE(std::filesystem::exists(dir / "tokenizer.json.tmp"));
}

TEST(BpeTrainer, ErrorsNameTheProblem) {
  const TempDir dir;
  std::ofstream(dir / "bad.jsonl") << "{\"text\": \"ok\"}\n{\"text\": \n";
  TrainTokenizerOptions options =
      train_tokenizer_flags().parse({"--input", dir / "bad.jsonl", "--vocab-size", "300", "--output", dir / "t.json"});
  std::ostringstream log;
  EXPECT_NE(error_of([&] { train_tokenizer(options, log); }).find("bad.jsonl line 2 is not valid JSON"),
            std::string::npos);
  std::ofstream(dir / "keys.jsonl") << "{\"body\": \"ok\"}\n";
  options.input = dir / "keys.jsonl";
  EXPECT_NE(error_of([&] { train_tokenizer(options, log); }).find("has no string field \"text\""), std::string::npos);
  std::ofstream(dir / "latin1.txt") << "caf\xE9\n";
  options.input = dir / "latin1.txt";
  EXPECT_NE(error_of([&] { train_tokenizer(options, log); }).find("document 0 is not valid UTF-8"), std::string::npos);
  EXPECT_NE(error_of([] { train({"abc"}, 100); }).find("--vocab-size 100 is too small"), std::string::npos);
  EXPECT_NE(error_of([] {
              train_tokenizer_flags().parse({"--input", "x", "--output", "y"});
            }).find("--vocab-size"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              train_tokenizer_flags().parse({"--bogus", "1"});
            }).find("--bogus: unknown flag"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              train_tokenizer_flags().parse({"--vocab-size", "ten"});
            }).find("--vocab-size 'ten': expected an integer"),
            std::string::npos);
  EXPECT_NE(train_tokenizer_flags().help().find("--min-frequency"), std::string::npos);
}
