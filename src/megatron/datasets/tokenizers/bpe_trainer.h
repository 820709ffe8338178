#pragma once
// Training a byte-level BPE (what `megatron train-tokenizer` runs): count the GPT-2 pre-tokens
// of a corpus on several threads, then merge greedily. The result is written as a
// tokenizer.json that HuggingFaceTokenizer (and Hugging Face tokenizers) read back.
//
// Ids 0-255 are the 256 bytes in GPT-2's stand-in order (as in GPT-2's vocabulary), merge r
// creates id 256 + r, and <|endoftext|> takes the last id as an added special token.
// Each step merges the pair with the highest count summed over all words; ties go to the
// smallest (left id, right id), so a corpus always gives the same tokenizer, whatever the
// number of threads.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megatron/datasets/tokenizers/bpe.h"

namespace megatron::datasets {

// Pre-token (raw bytes) -> occurrences.
using WordCounts = std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>>;

// Counts the GPT-2 pre-tokens of every document, splitting the documents over `threads`
// threads. Throws on a document that is not UTF-8, naming its index.
WordCounts count_words(const std::vector<std::string_view>& documents, int threads);

struct BpeModel {
  std::vector<std::string> tokens;                  // bytes of token id, for ids 0 .. size-1
  std::vector<std::pair<int32_t, int32_t>> merges;  // merge r joins these ids into id 256 + r
};

struct BpeTrainOptions {
  int64_t vocab_size = 0;     // the whole vocabulary, <|endoftext|> included; at least 257
  int64_t min_frequency = 2;  // a pair seen fewer times is not merged (training may stop early)
  // Called every few merges and at the end with (merges done, merges wanted).
  std::function<void(int64_t, int64_t)> progress;
};

BpeModel train_bpe(const WordCounts& counts, const BpeTrainOptions& options);

// The model as tokenizer.json: BPE with [left, right] merges, ByteLevel pre-tokenizer (GPT-2
// regex), post-processor and decoder, and <|endoftext|> as special added token after the model.
std::string bpe_tokenizer_json(const BpeModel& model);

}  // namespace megatron::datasets
