#pragma once
// Megatron's SentencePiece tokenizers over one libsentencepiece model file (--tokenizer-model
// file.model; interop-formats.md 5.6). The three --tokenizer-type values differ only in what
// Megatron wraps around the model:
//   SentencePieceTokenizer     appends <CLS> <SEP> <EOD> <MASK> and the model's pad, bos and eos
//                              pieces (<PAD> <BOS> <EOS> when the model has none) to the
//                              vocabulary unless present; encode() cuts the text at those
//                              tokens (the earliest first); decode() writes them with a space on
//                              either side; eod is <EOD>.
//   GPTSentencePieceTokenizer  the model's ids as they are; eod is the model's eos.
//   Llama2Tokenizer            as GPTSentencePieceTokenizer with the model's bos first.
#include <memory>

#include "megatron/datasets/tokenizers/tokenizer.h"

namespace megatron::datasets {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  enum class Flavor { megatron, gpt, llama2 };

  // Throws naming the file when it cannot be read or is not a SentencePiece model, and, for the
  // gpt and llama2 flavors, when the model has no eos (or bos) piece.
  SentencePieceTokenizer(const std::string& model_file, Flavor flavor);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  int32_t eod() const override;
  std::optional<int32_t> bos() const override;
  std::string name() const override;
  std::vector<SpecialToken> special_tokens() const override;  // the megatron flavor's added tokens
  std::vector<TokenizerFile> files() const override;          // tokenizer.model

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megatron::datasets
