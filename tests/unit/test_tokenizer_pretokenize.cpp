// Pre-tokenization: UTF-8 validation, the White_Space rewrite of \s, the GPT-2 and LLaMA-3 split
// regexes on hand-checked strings, and every Split behavior.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatron/datasets/tokenizers/pretokenize.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;

namespace {

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> split(const RegexSplitter& splitter, std::string_view text) {
  std::vector<std::string_view> pieces;
  splitter.split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

}  // namespace

TEST(Pretokenize, CheckUtf8AcceptsValidAndNamesTheFirstBadByte) {
  check_utf8("", "x");
  check_utf8("plain \xC3\xA9 \xE2\x82\xAC \xF0\x9F\xA4\x97 \xF4\x8F\xBF\xBF", "x");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"ab\x80", "byte 0x80 at offset 2"},            // stray continuation byte
      {"\xC0\x80", "byte 0xC0 at offset 0"},          // overlong NUL
      {"\xE0\x80\xAF", "byte 0xE0 at offset 0"},      // overlong
      {"\xED\xA0\x80", "byte 0xED at offset 0"},      // surrogate U+D800
      {"\xF4\x90\x80\x80", "byte 0xF4 at offset 0"},  // past U+10FFFF
      {"x\xE2\x82", "byte 0xE2 at offset 1"},         // truncated
  };
  for (const auto& [text, where] : bad) {
    const std::string error = error_of([&] { check_utf8(text, "the input"); });
    EXPECT_NE(error.find("the input is not valid UTF-8: " + where), std::string::npos) << error;
  }
}

TEST(Pretokenize, WhiteSpaceIsTheUnicodeProperty) {
  for (char32_t c : {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F,
                     0x205F, 0x3000}) {
    EXPECT_TRUE(is_unicode_white_space(c)) << std::hex << uint32_t(c);
  }
  for (char32_t c : {0x08, 0x1C, 0x1F, 0x180E, 0x200B, 0xFEFF, 0x41}) EXPECT_FALSE(is_unicode_white_space(c));
  // The regex agrees: U+0085 is space and U+180E (PCRE2's own \s takes it) and U+FEFF are not.
  const RegexSplitter spaces(R"(\s+)", SplitBehavior::removed, false);
  EXPECT_EQ(split(spaces,
                  "a\xC2\x85"
                  "b\xE1\xA0\x8E"
                  "c\xEF\xBB\xBF"
                  "d\xE3\x80\x80"
                  "e"),
            (std::vector<std::string>{"a",
                                      "b\xE1\xA0\x8E"
                                      "c\xEF\xBB\xBF"
                                      "d",
                                      "e"}));
  const RegexSplitter non_space(R"([^\s]+|\S)", SplitBehavior::removed, false);
  EXPECT_EQ(split(non_space, "ab \xC2\x85x"), (std::vector<std::string>{" \xC2\x85"}));
}

TEST(Pretokenize, Gpt2Pattern) {
  const RegexSplitter gpt2(kGpt2SplitPattern, SplitBehavior::isolated, false);
  EXPECT_EQ(
      split(gpt2, "I'm here, don't   go!!  42x\n\n"),
      (std::vector<std::string>{"I", "'m", " here", ",", " don", "'t", "  ", " go", "!!", " ", " 42", "x", "\n\n"}));
  // \p{L} and \p{N} are Unicode categories: accents, CJK, Devanagari letters; Nl and No digits.
  EXPECT_EQ(split(gpt2, "h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xE2\x85\xAB\xC2\xBD"),
            (std::vector<std::string>{"h\xC3\xA9llo", " \xE6\x97\xA5\xE6\x9C\xAC", " \xE2\x85\xAB\xC2\xBD"}));
  EXPECT_EQ(split(gpt2, "IT'S"), (std::vector<std::string>{"IT", "'", "S"}));  // case-sensitive contractions
}

TEST(Pretokenize, Llama3Pattern) {
  const RegexSplitter llama3(kLlama3Pattern, SplitBehavior::isolated, false);
  EXPECT_EQ(split(llama3, "IT'S 1234567 ok?!\r\n\n  x"),
            (std::vector<std::string>{"IT", "'S", " ", "123", "456", "7", " ok", "?!\r\n\n", " ", " x"}));
  EXPECT_EQ(split(llama3, "(hello)"), (std::vector<std::string>{"(hello", ")"}));
}

TEST(Pretokenize, SplitBehaviors) {
  const auto run = [](SplitBehavior b, bool invert) { return split(RegexSplitter("-", b, invert), "a--b-"); };
  using V = std::vector<std::string>;
  EXPECT_EQ(run(SplitBehavior::isolated, false), (V{"a", "-", "-", "b", "-"}));
  EXPECT_EQ(run(SplitBehavior::removed, false), (V{"a", "b"}));
  EXPECT_EQ(run(SplitBehavior::merged_with_previous, false), (V{"a-", "-", "b-"}));
  EXPECT_EQ(run(SplitBehavior::merged_with_next, false), (V{"a", "-", "-b", "-"}));
  EXPECT_EQ(run(SplitBehavior::contiguous, false), (V{"a", "--", "b", "-"}));
  EXPECT_EQ(run(SplitBehavior::removed, true), (V{"-", "-", "-"}));  // invert: the letters are the delimiters
  EXPECT_EQ(parse_split_behavior("MergedWithNext"), SplitBehavior::merged_with_next);
  EXPECT_NE(error_of([] { parse_split_behavior("Joined"); }).find("unknown Split behavior 'Joined'"),
            std::string::npos);
  // Empty matches cut nothing and do not loop.
  EXPECT_EQ(split(RegexSplitter("x*", SplitBehavior::isolated, false), "abxxc"), (V{"ab", "xx", "c"}));
  EXPECT_NE(error_of([] { RegexSplitter("(unclosed", SplitBehavior::isolated, false); }).find("does not compile"),
            std::string::npos);
}
