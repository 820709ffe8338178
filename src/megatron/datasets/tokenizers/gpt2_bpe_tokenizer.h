#pragma once
// Megatron's GPT2BPETokenizer: GPT-2's vocab.json + merges.txt (interop-formats.md 5.5), the
// GPT-2 split regex, byte-level BPE. As in Megatron, <|endoftext|> in the text is plain text
// (it encodes to the pieces of "<", "|", ...); it is the end-of-document id.
#include "megatron/datasets/tokenizers/bpe.h"
#include "megatron/datasets/tokenizers/pretokenize.h"
#include "megatron/datasets/tokenizers/tokenizer.h"

namespace megatron::datasets {

class GPT2BPETokenizer final : public Tokenizer {
 public:
  static constexpr const char* kEndOfText = "<|endoftext|>";

  // Throws naming the file when one is missing or malformed, or the vocabulary lacks
  // <|endoftext|>.
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file);

  std::vector<int32_t> encode(std::string_view text) const override;
  // Concatenates the tokens' bytes; throws on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return bpe_.size(); }  // Megatron: len(encoder), 50257
  int32_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }
  std::vector<TokenizerFile> files() const override;  // vocab.json, merges.txt

 private:
  GPT2BPETokenizer(BytePairEncoder bpe, std::string vocab_file, std::string merge_file);
  std::string vocab_file_, merge_file_;
  BytePairEncoder bpe_;
  RegexSplitter splitter_;
  int32_t eod_;
};

}  // namespace megatron::datasets
