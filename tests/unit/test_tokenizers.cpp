#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/byte_tokenizer.h"
#include "megatron/datasets/tokenizers/null_tokenizer.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using namespace std::string_literals;

namespace {

using megatron::testing::error_of;

}  // namespace

TEST(ByteTokenizer, IdsAreTheBytes) {
  const ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_EQ(tok.eod(), 256);
  EXPECT_EQ(tok.name(), "ByteTokenizer");
  EXPECT_EQ(tok.encode("Hi!"), (std::vector<int32_t>{72, 105, 33}));
  // U+1F600 is F0 9F 98 80 in UTF-8; é is C3 A9.
  EXPECT_EQ(tok.encode("\xF0\x9F\x98\x80\xC3\xA9"), (std::vector<int32_t>{0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xA9}));
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{});
}

TEST(ByteTokenizer, RoundTripsArbitraryBytes) {
  const ByteTokenizer tok;
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte.push_back(static_cast<char>(b));
  EXPECT_EQ(tok.decode(tok.encode(every_byte)), every_byte);
  const std::string invalid_utf8 = "a\xFF\xFE\xC3(\xE2\x82 \xF0\x9F\x98\x80 \x00z"s;  // NUL kept by "s"
  EXPECT_EQ(tok.decode(tok.encode(invalid_utf8)), invalid_utf8);
}

TEST(ByteTokenizer, DecodeSkipsEodAndRejectsNegativeIds) {
  const ByteTokenizer tok;
  EXPECT_EQ(tok.decode({104, 256, 105, 300}), "hi");
  EXPECT_NE(error_of([&] { tok.decode({65, -1}); }).find("negative id -1"), std::string::npos);
}

TEST(NullTokenizer, ParsesWhitespaceSeparatedIds) {
  const NullTokenizer tok(1000);
  EXPECT_EQ(tok.vocab_size(), 1000);
  EXPECT_EQ(tok.eod(), 999);  // Megatron HEAD: the last id
  EXPECT_EQ(tok.name(), "NullTokenizer");
  EXPECT_EQ(tok.encode(" 1  22\n333\t+4 0 "), (std::vector<int32_t>{1, 22, 333, 4, 0}));
  EXPECT_EQ(tok.encode("   "), std::vector<int32_t>{});
  EXPECT_EQ(tok.decode({5, 0, 999}), "5 0 999");
  const std::vector<int32_t> ids = {17, 3, 998, 0, 42};
  EXPECT_EQ(tok.encode(tok.decode(ids)), ids);
}

TEST(NullTokenizer, RejectsWordsThatAreNotIdsInTheVocabulary) {
  const NullTokenizer tok(100);
  EXPECT_NE(error_of([&] { tok.encode("1 two 3"); }).find("'two'"), std::string::npos);
  EXPECT_NE(error_of([&] { tok.encode("1 2x"); }).find("'2x'"), std::string::npos);
  EXPECT_NE(error_of([&] { tok.encode("100"); }).find("id 100 is outside the vocabulary [0, 100)"), std::string::npos);
  EXPECT_NE(error_of([&] { tok.encode("-1"); }).find("id -1"), std::string::npos);
  EXPECT_NE(error_of([] { NullTokenizer(0); }).find("--vocab-size"), std::string::npos);
}

TEST(TokenizerFactory, BuildsTheNamedTokenizer) {
  EXPECT_EQ(supported_tokenizer_types(),
            (std::vector<std::string>{"ByteTokenizer", "NullTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer",
                                      "SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer",
                                      "TikTokenizer"}));
  const auto byte = make_tokenizer("ByteTokenizer", 0, "");
  EXPECT_EQ(byte->name(), "ByteTokenizer");
  EXPECT_EQ(make_tokenizer("ByteTokenizer", 257, "")->vocab_size(), 257);
  const auto null = make_tokenizer("NullTokenizer", 50304, "");
  EXPECT_EQ(null->name(), "NullTokenizer");
  EXPECT_EQ(null->eod(), 50303);
}

TEST(TokenizerFactory, ErrorsNameTheProblem) {
  const std::string unknown = error_of([] { make_tokenizer("MultimodalTokenizer", 0, ""); });
  EXPECT_NE(unknown.find("'MultimodalTokenizer'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("supported: ByteTokenizer (no files), NullTokenizer (--vocab-size), GPT2BPETokenizer "
                         "(--vocab-file vocab.json --merge-file merges.txt), HuggingFaceTokenizer"),
            std::string::npos)
      << unknown;
  EXPECT_NE(error_of([] { make_tokenizer("NullTokenizer", 0, ""); }).find("--vocab-size"), std::string::npos);
  EXPECT_NE(error_of([] { make_tokenizer("ByteTokenizer", 300, ""); }).find("fixed vocabulary of 257"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_tokenizer("ByteTokenizer", 0, "tok.model"); }).find("--tokenizer-model tok.model"),
            std::string::npos);
  TokenizerOptions options;
  options.type = "NullTokenizer";
  options.vocab_size = 10;
  options.merge_file = "merges.txt";
  EXPECT_NE(error_of([&] { make_tokenizer(options); }).find("NullTokenizer takes no --merge-file"), std::string::npos);
  options.type = "HuggingFaceTokenizer";
  options.merge_file.clear();
  EXPECT_NE(error_of([&] { make_tokenizer(options); }).find("HuggingFaceTokenizer needs --tokenizer-model"),
            std::string::npos);
}

// What a tokenizer type reads decides whether a command line's flags name a whole tokenizer (a run
// with --load then leaves the checkpoint's saved tokenizer alone).
TEST(TokenizerOptions, CompleteWhenEveryFlagTheTypeReadsIsGiven) {
  const auto options = [](std::string type, int64_t vocab_size, std::string model, std::string vocab,
                          std::string merges) {
    return TokenizerOptions{type, vocab_size, model, vocab, merges, "", 0, {}};
  };
  EXPECT_FALSE(tokenizer_options_complete(options("", 0, "", "", "")));
  EXPECT_FALSE(tokenizer_options_complete(options("MultimodalTokenizer", 0, "t.model", "", "")));
  EXPECT_FALSE(tokenizer_options_complete(options("TikTokenizer", 0, "", "", "")));
  EXPECT_TRUE(tokenizer_options_complete(options("TikTokenizer", 0, "vocab.json", "", "")));  // --vocab-size optional
  EXPECT_TRUE(tokenizer_options_complete(options("ByteTokenizer", 0, "", "", "")));
  EXPECT_FALSE(tokenizer_options_complete(options("NullTokenizer", 0, "", "", "")));
  EXPECT_TRUE(tokenizer_options_complete(options("NullTokenizer", 100, "", "", "")));
  EXPECT_FALSE(tokenizer_options_complete(options("GPT2BPETokenizer", 0, "", "vocab.json", "")));
  EXPECT_FALSE(tokenizer_options_complete(options("GPT2BPETokenizer", 0, "", "", "merges.txt")));
  EXPECT_TRUE(tokenizer_options_complete(options("GPT2BPETokenizer", 0, "", "vocab.json", "merges.txt")));
  for (const char* type :
       {"HuggingFaceTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"}) {
    EXPECT_FALSE(tokenizer_options_complete(options(type, 0, "", "", ""))) << type;
    EXPECT_TRUE(tokenizer_options_complete(options(type, 0, "tok", "", ""))) << type;
  }
}

// Megatron's command line wins over a checkpoint's arguments flag by flag; a different type
// replaces the whole tokenizer (its files would not fit the saved type's).
TEST(TokenizerOptions, GivenFlagsOverrideTheSavedOnesOfTheSameType) {
  const TokenizerOptions saved{"GPT2BPETokenizer", 0, "", "/ckpt/vocab.json", "/ckpt/merges.txt", "", 0, {}};
  EXPECT_EQ(complete_tokenizer_options({}, saved).vocab_file, "/ckpt/vocab.json");
  EXPECT_EQ(complete_tokenizer_options({}, saved).type, "GPT2BPETokenizer");
  TokenizerOptions given{"GPT2BPETokenizer", 0, "", "", "/mine/merges.txt", "", 0, {}};
  const TokenizerOptions mixed = complete_tokenizer_options(given, saved);
  EXPECT_EQ(mixed.vocab_file, "/ckpt/vocab.json");
  EXPECT_EQ(mixed.merge_file, "/mine/merges.txt");
  given.type.clear();  // no --tokenizer-type: the saved one
  EXPECT_EQ(complete_tokenizer_options(given, saved).merge_file, "/mine/merges.txt");
  EXPECT_EQ(complete_tokenizer_options(given, saved).type, "GPT2BPETokenizer");
  const TokenizerOptions other{"NullTokenizer", 100, "", "", "", "", 0, {}};
  const TokenizerOptions replaced = complete_tokenizer_options(other, saved);
  EXPECT_EQ(replaced.type, "NullTokenizer");
  EXPECT_EQ(replaced.vocab_size, 100);
  EXPECT_TRUE(replaced.vocab_file.empty() && replaced.merge_file.empty());
  const TokenizerOptions null_saved{"NullTokenizer", 100, "", "", "", "", 0, {}};
  EXPECT_EQ(complete_tokenizer_options({"", 200, "", "", "", "", 0, {}}, null_saved).vocab_size, 200);
}

TEST(TokenizerOptions, FilesMoveIntoADirectoryByName) {
  const TokenizerOptions given{"HuggingFaceTokenizer", 0, "/data/llama3", "", "", "", 0, {}};
  const std::vector<TokenizerFile> files = {{"--tokenizer-model", "/data/llama3/tokenizer.json", "tokenizer.json"},
                                            {"", "/data/llama3/tokenizer_config.json", "tokenizer_config.json"}};
  const TokenizerOptions moved = tokenizer_options_in(given, files, "/ckpt/iter_0000010");
  EXPECT_EQ(moved.model, "/ckpt/iter_0000010/tokenizer.json");
  EXPECT_EQ(moved.type, "HuggingFaceTokenizer");
  const TokenizerOptions gpt2 = tokenizer_options_in(
      {"GPT2BPETokenizer", 0, "", "a/v.json", "b/m.txt", "", 0, {}},
      {{"--vocab-file", "a/v.json", "vocab.json"}, {"--merge-file", "b/m.txt", "merges.txt"}}, "/c");
  EXPECT_EQ(gpt2.vocab_file, "/c/vocab.json");
  EXPECT_EQ(gpt2.merge_file, "/c/merges.txt");
  EXPECT_NE(error_of([] {
              tokenizer_options_in({}, {{"--bogus", "x", "x"}}, "/c");
            }).find("'--bogus'"),
            std::string::npos);
}
