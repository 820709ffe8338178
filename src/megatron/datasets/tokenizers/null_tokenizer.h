#pragma once
// Megatron's NullTokenizer (HEAD semantics): the text already is the ids, written as
// whitespace-separated decimal integers. vocab_size is taken as given and EOD is its last id,
// vocab_size - 1. (Older Megatron releases used vocab_size + 1 entries with EOD = vocab_size.)
#include "megatron/datasets/tokenizers/tokenizer.h"

namespace megatron::datasets {

class NullTokenizer final : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size);

  // Throws on a word that is not a decimal integer in [0, vocab_size); Megatron would write
  // out-of-range ids unchecked, which later fail in the embedding.
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;  // ids joined by single spaces
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return int32_t(vocab_size_ - 1); }
  std::string name() const override { return "NullTokenizer"; }

 private:
  int64_t vocab_size_;
};

}  // namespace megatron::datasets
