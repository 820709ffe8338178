// Megatron's TikTokenizer on a vocabulary small enough to work out by hand: the 256 bytes, then
// "ab" (rank 256), "bc" (257), "abc" (258) and " w" (259), 10 special tokens (Megatron's seven and
// three fillers), so rank r is id r + 10. tiktoken merges adjacent parts whose concatenation is a
// token, lowest rank first: "abc" goes a|b|c -> ab|c (ab: 256 < bc: 257) -> abc, a merge no
// "a bc"-style merge list of "abc" would make. (Parity with tiktoken itself on a real vocabulary:
// test_tokenizer_parity.cpp.)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/tiktoken_tokenizer.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "test_util.h"
#include "tiktoken_vocab.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;
using megatron::testing::TempDir;
using megatron::testing::tiktoken_vocabulary;

namespace {

std::string write(const TempDir& dir, const nlohmann::json& vocab) {
  const std::string path = dir / "vocab.json";
  std::ofstream(path) << vocab.dump();
  return path;
}

const std::vector<std::string> kLonger = {"ab", "bc", "abc", " w"};
constexpr int32_t kSpecial = 10;

TikTokenizer small(const std::string& path) {
  return TikTokenizer(path, {.pattern = "v2", .num_special_tokens = kSpecial, .vocab_size = 256 + 4 + kSpecial});
}

}  // namespace

TEST(TikTokenizer, MergesByRankAsTiktoken) {
  const TempDir dir;
  const TikTokenizer tok = small(write(dir, tiktoken_vocabulary(kLonger)));
  EXPECT_EQ(tok.vocab_size(), 270);
  EXPECT_EQ(tok.name(), "TikTokenizer");
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{258 + kSpecial}));
  // b|c|b|c: the two "bc" pairs share a rank, the leftmost first, then the other; "bcb" is none.
  EXPECT_EQ(tok.encode("bcbc"), (std::vector<int32_t>{257 + kSpecial, 257 + kSpecial}));
  // The v2 pattern cuts "a w" into "a" and " w" (a space joins the word after it).
  EXPECT_EQ(tok.encode("a w"), (std::vector<int32_t>{'a' + kSpecial, 259 + kSpecial}));
  EXPECT_EQ(tok.decode(tok.encode("bcbc a w abc")), "bcbc a w abc");
}

// Megatron's text_to_ids (allowed_special="all"): special tokens' text is their id, fillers too.
TEST(TikTokenizer, SpecialTokensInTheTextAreTheirIds) {
  const TempDir dir;
  const TikTokenizer tok = small(write(dir, tiktoken_vocabulary(kLonger)));
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eod(), 2);
  EXPECT_EQ(tok.encode("ab<s>bc</s><SPECIAL_9>"),
            (std::vector<int32_t>{256 + kSpecial, 1, 257 + kSpecial, 2, 9}));
  EXPECT_EQ(tok.encode("<s"), (std::vector<int32_t>{'<' + kSpecial, 's' + kSpecial}));  // not a special token
  EXPECT_EQ(tok.decode({1, 256 + kSpecial, 9}), "<s>ab<SPECIAL_9>");
  const std::vector<SpecialToken> specials = tok.special_tokens();
  ASSERT_EQ(specials.size(), size_t(kSpecial));
  EXPECT_EQ(specials[4], (SpecialToken{"<pad>", 4}));
  EXPECT_EQ(specials[7], (SpecialToken{"<SPECIAL_7>", 7}));
}

// --tokenizer-type TikTokenizer through the factory: Megatron's defaults, and its flags refused
// by the other tokenizers.
TEST(TikTokenizer, FactoryTakesItsFlags) {
  const TempDir dir;
  const std::string path = write(dir, tiktoken_vocabulary(kLonger));
  TokenizerOptions o;
  o.type = "TikTokenizer";
  o.model = path;
  o.vocab_size = 270;
  o.tiktoken_num_special_tokens = 10;
  o.tiktoken_pattern = "v1";
  o.special_tokens = {"<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>", "<tool>"};
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(o);
  EXPECT_EQ(tok->encode("<tool>abc"), (std::vector<int32_t>{7, 258 + kSpecial}));
  EXPECT_EQ(tok->files(), (std::vector<TokenizerFile>{{"--tokenizer-model", path, "tiktoken.json"}}));
  EXPECT_TRUE(tokenizer_options_complete(o));
  TokenizerOptions defaults;
  defaults.type = "TikTokenizer";
  defaults.model = path;  // 1000 specials and 131072 ids need 130072 ranks: the file holds 260
  EXPECT_NE(error_of([&] { make_tokenizer(defaults); }).find("holds 260 tokens, but --vocab-size less the special "
                                                             "tokens needs 130072"),
            std::string::npos);
  TokenizerOptions other = o;
  other.type = "ByteTokenizer";
  other.model.clear();
  other.vocab_size = 0;
  EXPECT_NE(error_of([&] { make_tokenizer(other); }).find("ByteTokenizer takes no --tiktoken-pattern"),
            std::string::npos);
}

TEST(TikTokenizer, BadVocabulariesAndOptionsAreErrorsNamingThem) {
  const TempDir dir;
  const auto error_with = [&](const nlohmann::json& vocab, TikTokenizerOptions options = {}) {
    if (options.vocab_size == 131072) options = {.pattern = "v2", .num_special_tokens = 10, .vocab_size = 270};
    const std::string path = write(dir, vocab);
    return error_of([&] { TikTokenizer(path, options); });
  };
  nlohmann::json wrong_rank = tiktoken_vocabulary(kLonger);
  wrong_rank[257]["rank"] = 300;
  EXPECT_NE(error_with(wrong_rank).find("entry 257 has rank 300"), std::string::npos);
  nlohmann::json extra_key = tiktoken_vocabulary(kLonger);
  extra_key[3]["id"] = 3;
  EXPECT_NE(error_with(extra_key).find("entry 3 is"), std::string::npos);
  nlohmann::json bytes_out_of_order = tiktoken_vocabulary(kLonger);
  std::swap(bytes_out_of_order[65]["token_bytes"], bytes_out_of_order[66]["token_bytes"]);
  EXPECT_NE(error_with(bytes_out_of_order).find("entry 65 must be the single byte 65"), std::string::npos);
  nlohmann::json bad_base64 = tiktoken_vocabulary(kLonger);
  bad_base64[258]["token_bytes"] = "YWJj!";
  EXPECT_NE(error_with(bad_base64).find("entry 258's token_bytes"), std::string::npos);
  nlohmann::json repeated = tiktoken_vocabulary({"ab", "bc", "ab", " w"});
  EXPECT_NE(error_with(repeated).find("appears twice"), std::string::npos);
  EXPECT_NE(error_with(tiktoken_vocabulary(kLonger), {.pattern = "v3", .num_special_tokens = 10, .vocab_size = 270})
                .find("--tiktoken-pattern v3"),
            std::string::npos);
  EXPECT_NE(error_with(tiktoken_vocabulary(kLonger),
                       {.num_special_tokens = 10, .special_tokens = {"<unk>", "<s>", "</s>"}, .vocab_size = 270})
                .find("<mask> is missing"),
            std::string::npos);
  EXPECT_NE(error_with(tiktoken_vocabulary(kLonger), {.num_special_tokens = 5, .vocab_size = 270})
                .find("special tokens <= num special tokens < vocab size"),
            std::string::npos);
}
