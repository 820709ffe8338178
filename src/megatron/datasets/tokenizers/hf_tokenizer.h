#pragma once
// Megatron's HuggingFaceTokenizer for byte-level BPE `tokenizer.json` files (GPT-2, LLaMA-3,
// our train-tokenizer; interop-formats.md 5.1-5.4). What it reads:
//   model          BPE (type "BPE" or absent), merges as "a b" strings or [a, b] pairs,
//                  ignore_merges; no dropout, subword prefix/suffix or byte_fallback
//   added_tokens   matched on the raw text before the pipeline, leftmost then longest, in two
//                  passes as tokenizers does (normalized=false tokens first); lstrip/rstrip
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex) and Split (Regex or String pattern,
//                  any behavior, invert), alone or in a Sequence; a ByteLevel step is required
//   post_processor ByteLevel (no effect on ids), TemplateProcessing (single template: BOS/EOS
//                  around the text), or a Sequence of them
//   decoder        ByteLevel
// Anything else (a normalizer, WordPiece/Unigram models, single_word added tokens,
// truncation or padding) is rejected with an error naming it, never ignored.
//
// As transformers does for Megatron: encode() applies the post-processor template (LLaMA-3 as
// Meta publishes it prepends <|begin_of_text|>), decode() keeps special tokens' text, and
// vocab_size() counts added tokens (LLaMA-3: 128256). eod() and bos() come from eos_token and
// bos_token of a tokenizer_config.json beside tokenizer.json, or else from the first of
// <|end_of_text|>, <|endoftext|>, </s> (and <|begin_of_text|>, <s>) that the vocabulary has.
#include <memory>

#include "megatron/datasets/tokenizers/tokenizer.h"

namespace megatron::datasets {

class HuggingFaceTokenizer final : public Tokenizer {
 public:
  // path: a tokenizer.json file, or a directory holding tokenizer.json. Throws naming the file
  // and the offending field when it is malformed or uses an unsupported component.
  explicit HuggingFaceTokenizer(const std::string& path);
  ~HuggingFaceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  // Tokens' bytes in order, special tokens included; throws on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  int32_t eod() const override;
  std::optional<int32_t> bos() const override;
  std::string name() const override { return "HuggingFaceTokenizer"; }
  std::vector<SpecialToken> special_tokens() const override;  // added tokens marked special
  // tokenizer.json, and the tokenizer_config.json beside it when it was read.
  std::vector<TokenizerFile> files() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megatron::datasets
