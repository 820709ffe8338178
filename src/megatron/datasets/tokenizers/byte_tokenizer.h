#pragma once
// One token per byte: ids 0..255 are the bytes of the UTF-8 (or any) input, 256 is the end of
// document. Needs no model file and round-trips arbitrary bytes, invalid UTF-8 included.
#include "megatron/datasets/tokenizers/tokenizer.h"

namespace megatron::datasets {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEod = 256;
  static constexpr int64_t kVocabSize = 257;

  std::vector<int32_t> encode(std::string_view text) const override;
  // Ids 256 and above (EOD) are skipped: they stand for no byte. Negative ids are an error.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  int32_t eod() const override { return kEod; }
  std::string name() const override { return "ByteTokenizer"; }
};

}  // namespace megatron::datasets
