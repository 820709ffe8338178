#pragma once
// `megatron train-tokenizer`: trains a byte-level BPE on a corpus and writes tokenizer.json
// (bpe_trainer.h), which --tokenizer-type HuggingFaceTokenizer --tokenizer-model reads.
// Input: JSON lines (a .jsonl/.json file: the --json-keys strings of each line are documents)
// or plain text (any other file: each line is a document). The input is held in memory.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace megatron::flags {
template <class Options>
class FlagTable;
}

namespace megatron::datasets {

struct TrainTokenizerOptions {
  std::string input;                           // --input corpus.jsonl | corpus.txt
  std::vector<std::string> json_keys{"text"};  // --json-keys K [K ...]
  int64_t vocab_size = 0;                      // --vocab-size: the whole vocabulary (required)
  std::string output;                          // --output tokenizer.json
  int64_t workers = 0;                         // --workers: counting threads (0: all cores)
  int64_t min_frequency = 2;                   // --min-frequency: rarer pairs are not merged
};

// The flags of `megatron train-tokenizer`, one row per field above (flags/flag_table.h parses
// them, with validate() below, and generates --help).
const flags::FlagTable<TrainTokenizerOptions>& train_tokenizer_flags();
// Every rule the options break, one message each; train_tokenizer() throws them.
std::vector<std::string> validate(const TrainTokenizerOptions& options);

struct TrainTokenizerReport {
  int64_t documents = 0;
  int64_t bytes = 0;
  int64_t distinct_words = 0;
  int64_t vocab_size = 0;  // written: may fall short of --vocab-size when pairs run out
};

// Reads, counts, trains and writes options.output (atomically: a temporary file renamed into
// place). Progress lines go to `log`. Throws naming the line of malformed JSON input.
TrainTokenizerReport train_tokenizer(const TrainTokenizerOptions& options, std::ostream& log);

}  // namespace megatron::datasets
