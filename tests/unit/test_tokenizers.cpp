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
                                      "SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"}));
  const auto byte = make_tokenizer("ByteTokenizer", 0, "");
  EXPECT_EQ(byte->name(), "ByteTokenizer");
  EXPECT_EQ(make_tokenizer("ByteTokenizer", 257, "")->vocab_size(), 257);
  const auto null = make_tokenizer("NullTokenizer", 50304, "");
  EXPECT_EQ(null->name(), "NullTokenizer");
  EXPECT_EQ(null->eod(), 50303);
}

TEST(TokenizerFactory, ErrorsNameTheProblem) {
  const std::string unknown = error_of([] { make_tokenizer("TikTokenizer", 0, ""); });
  EXPECT_NE(unknown.find("'TikTokenizer'"), std::string::npos) << unknown;
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
