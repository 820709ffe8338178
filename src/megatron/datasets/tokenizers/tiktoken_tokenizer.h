#pragma once
// Megatron's TikTokenizer (megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py): tiktoken's
// byte-pair ranks from a JSON vocabulary. What it reads and does, as Megatron:
//   --tokenizer-model  a JSON list of {"rank": i, "token_bytes": base64, "token_str": text}, entry i
//                      of rank i, the 256 single bytes first in byte order; only the first
//                      vocab_size - num_special_tokens entries are used
//   ids                0 .. num_special_tokens-1 are the special tokens: --special-tokens (which
//                      must hold Megatron's <unk> <s> </s> <mask> <pad> <cls> <sep>; unset: those
//                      seven) then <SPECIAL_k> fillers; rank r is id r + num_special_tokens
//   encode             special tokens' text in the input is their id (tiktoken's
//                      allowed_special="all", Megatron's text_to_ids; the longest where one is a
//                      prefix of another), the rest split by the
//                      --tiktoken-pattern regex (v1 or v2) and each piece merged by rank
//                      (BytePairEncoder::from_ranks: tiktoken's byte_pair_merge)
//   vocab_size()       --vocab-size (Megatron's default 131072), whatever the file holds past it
//   eod(), bos()       </s> and <s>
#include <array>
#include <string>
#include <vector>

#include "megatron/datasets/tokenizers/bpe.h"
#include "megatron/datasets/tokenizers/pretokenize.h"
#include "megatron/datasets/tokenizers/tokenizer.h"

namespace megatron::datasets {

// Megatron's special tokens, in its order (their ids).
inline const std::vector<std::string> kTikTokenSpecialTokens = {"<unk>", "<s>",   "</s>", "<mask>",
                                                               "<pad>", "<cls>", "<sep>"};

struct TikTokenizerOptions {
  std::string pattern = "v2";          // --tiktoken-pattern: v1 | v2
  int64_t num_special_tokens = 1000;   // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens = kTikTokenSpecialTokens;  // --special-tokens
  int64_t vocab_size = 131072;         // --vocab-size
};

class TikTokenizer final : public Tokenizer {
 public:
  // Throws naming the file, the entry and the rule when the vocabulary or an option is malformed.
  TikTokenizer(const std::string& path, const TikTokenizerOptions& options);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eos_; }
  std::optional<int32_t> bos() const override { return bos_; }
  std::string name() const override { return "TikTokenizer"; }
  std::vector<SpecialToken> special_tokens() const override;
  std::vector<TokenizerFile> files() const override { return {{"--tokenizer-model", path_, "tiktoken.json"}}; }

 private:
  // Appends the ids of text without special tokens.
  void encode_ordinary(std::string_view text, std::vector<int32_t>& ids) const;

  std::string path_;
  std::vector<std::string> specials_;  // by id
  std::array<std::vector<int32_t>, 256> specials_by_first_byte_;  // the ids whose text starts with the byte
  int64_t vocab_size_;
  int32_t bos_, eos_;
  BytePairEncoder bpe_;
  RegexSplitter splitter_;
};

}  // namespace megatron::datasets
