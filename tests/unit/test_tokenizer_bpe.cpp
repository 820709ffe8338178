// The byte-level BPE core on small handcrafted vocabularies: the stand-in table of
// interop-formats.md 5.5, merge order and ties, ignore_merges, the heap path for long words
// against the scan path, the per-thread cache across threads, and load errors.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "megatron/datasets/tokenizers/bpe.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;

namespace {

using Vocab = std::vector<std::pair<std::string, int32_t>>;
using Merges = std::vector<std::pair<std::string, std::string>>;

// The 256 byte tokens (id = byte) plus `extra` tokens in stand-in form.
Vocab byte_vocab(const std::vector<std::string>& extra) {
  Vocab vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(bytes_to_unicode_string(std::string(1, char(b))), b);
  for (const std::string& t : extra) vocab.emplace_back(t, int32_t(vocab.size()));
  return vocab;
}

std::vector<int32_t> encode(const BytePairEncoder& bpe, std::string_view word) {
  std::vector<int32_t> ids;
  bpe.encode_word(word, ids);
  return ids;
}

}  // namespace

TEST(BytePairEncoder, StandInTable) {
  EXPECT_EQ(byte_to_unicode(' '), char32_t(0x120));
  EXPECT_EQ(byte_to_unicode('\n'), char32_t(0x10A));
  EXPECT_EQ(byte_to_unicode('\t'), char32_t(0x109));
  EXPECT_EQ(byte_to_unicode(0x7F), char32_t(0x121));
  EXPECT_EQ(byte_to_unicode(0xAD), char32_t(0x143));
  EXPECT_EQ(byte_to_unicode('A'), char32_t('A'));
  EXPECT_EQ(byte_to_unicode(0xE9), char32_t(0xE9));
  EXPECT_EQ(bytes_to_unicode_string(" a\n"),
            "\xC4\xA0"
            "a\xC4\x8A");
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte.push_back(char(b));
  EXPECT_EQ(unicode_string_to_bytes(bytes_to_unicode_string(every_byte)), every_byte);
  EXPECT_FALSE(unicode_string_to_bytes(" ").has_value());             // U+0020 is not a stand-in
  EXPECT_FALSE(unicode_string_to_bytes("\xE6\x97\xA5").has_value());  // nor is a CJK character
}

TEST(BytePairEncoder, LowestRankFirstAndLeftmostOnTies) {
  // Ranks: "a a" 0, "b c" 1, "aa a" 2. In "aaa" both (a,a) pairs have rank 0: the left one merges.
  const BytePairEncoder bpe(byte_vocab({"aa", "bc", "aaa"}), {{"a", "a"}, {"b", "c"}, {"aa", "a"}}, false, "test");
  EXPECT_EQ(encode(bpe, "aaa"), std::vector<int32_t>{258});
  EXPECT_EQ(encode(bpe, "aaaa"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(encode(bpe, "abca"), (std::vector<int32_t>{'a', 257, 'a'}));
  EXPECT_EQ(encode(bpe, "aab"), (std::vector<int32_t>{256, 'b'}));
  EXPECT_EQ(encode(bpe, "x"), std::vector<int32_t>{'x'});
  EXPECT_EQ(bpe.token_bytes(258), "aaa");
  EXPECT_EQ(bpe.token_id("bc"), 257);
  EXPECT_EQ(bpe.size(), 259);
}

TEST(BytePairEncoder, IgnoreMergesEmitsWholeVocabularyWords) {
  // "abc" is in the vocabulary but no merge builds it: only ignore_merges finds it.
  const Vocab vocab = byte_vocab({"ab", "abc"});
  const Merges merges = {{"a", "b"}};
  EXPECT_EQ(encode(BytePairEncoder(vocab, merges, false, "t"), "abc"), (std::vector<int32_t>{256, 'c'}));
  EXPECT_EQ(encode(BytePairEncoder(vocab, merges, true, "t"), "abc"), std::vector<int32_t>{257});
}

// Words longer than 64 bytes take the heap path; cutting such a word where no merge crosses
// must give the concatenation of the short results.
TEST(BytePairEncoder, HeapPathAgreesWithScanPath) {
  const BytePairEncoder bpe(byte_vocab({"ab", "cd", "abcd", "abab", "ee"}),
                            {{"c", "d"}, {"a", "b"}, {"e", "e"}, {"ab", "cd"}, {"ab", "ab"}}, false, "t");
  const std::string unit = "abcdabababeeezab";  // ends in z...: no merge crosses units
  std::string word;
  std::vector<int32_t> expected;
  for (int k = 0; k < 20; ++k) {
    word += unit;
    const std::vector<int32_t> part = encode(bpe, unit);
    expected.insert(expected.end(), part.begin(), part.end());
  }
  ASSERT_GT(word.size(), 64u);
  EXPECT_EQ(encode(bpe, unit), (std::vector<int32_t>{258, 259, 256, 260, 'e', 'z', 256}));
  EXPECT_EQ(encode(bpe, word), expected);
}

TEST(BytePairEncoder, ThreadsShareOneEncoder) {
  const BytePairEncoder bpe(byte_vocab({"ab"}), {{"a", "b"}}, false, "t");
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 1000; ++k) results[t] = encode(bpe, "xabab" + std::to_string(k % 10));
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, (std::vector<int32_t>{'x', 256, 256, '9'}));
}

TEST(BytePairEncoder, LoadErrorsNameTheProblem) {
  std::string error = error_of([] { BytePairEncoder(byte_vocab({}), {{"a", "q"}}, false, "files X"); });
  EXPECT_NE(error.find("files X: merge 0 'a q' uses a token missing from the vocabulary ('aq')"), std::string::npos)
      << error;
  error = error_of([] { BytePairEncoder(byte_vocab({"a"}), {}, false, "t"); });
  EXPECT_NE(error.find("token 'a' appears twice"), std::string::npos) << error;
  error = error_of([] { BytePairEncoder({{"a", 0}, {"b", 0}}, {}, false, "t"); });
  EXPECT_NE(error.find("id 0 is given to two tokens"), std::string::npos) << error;
  const BytePairEncoder partial({{"a", 0}}, {}, false, "tiny");
  error = error_of([&] { encode(partial, "ab"); });
  EXPECT_NE(error.find("tiny: byte 0x62 has no token"), std::string::npos) << error;
}
