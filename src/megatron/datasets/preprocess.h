#pragma once
// `megatron preprocess-data`: JSON lines -> Megatron .bin/.idx, one dataset per JSON key, as
// Megatron's tools/preprocess_data.py writes them (megatron-compat.md section 1.5; no sentence
// splitting yet). A reader thread feeds N tokenizer threads; results are written in input
// order, so the output does not depend on the number of workers.
//
// Ours beyond Megatron: a malformed line (bad JSON, not an object, a missing or non-string
// key, text the tokenizer rejects) is reported with its line number and skipped instead of
// aborting the run, up to --max-bad-lines-fraction of the lines; blank lines are skipped.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace megatron::flags {
template <class Options>
class FlagTable;
}

namespace megatron::datasets {

struct PreprocessOptions {
  std::string input;                           // --input FILE.jsonl
  std::string output_prefix;                   // --output-prefix P
  std::vector<std::string> json_keys{"text"};  // --json-keys K [K ...]
  std::string tokenizer_type;                  // --tokenizer-type
  int64_t vocab_size = 0;                      // --vocab-size (0: not given)
  std::string tokenizer_model;                 // --tokenizer-model
  std::string vocab_file, merge_file;          // --vocab-file, --merge-file (GPT2BPETokenizer)
  std::string tiktoken_pattern;                // --tiktoken-pattern (TikTokenizer)
  int64_t tiktoken_num_special_tokens = 0;     // --tiktoken-num-special-tokens (TikTokenizer)
  std::vector<std::string> special_tokens;     // --special-tokens (TikTokenizer)
  bool append_eod = false;                     // --append-eod
  int64_t workers = 1;                         // --workers: tokenizer threads
  double max_bad_lines_fraction = 0.001;       // --max-bad-lines-fraction
};

// The flags of `megatron preprocess-data`, one row per field above (flags/flag_table.h parses
// them, with validate() below, and generates --help).
const flags::FlagTable<PreprocessOptions>& preprocess_flags();
// Every rule the options break, one message each (value, rule, fix); preprocess_data() throws them.
std::vector<std::string> validate(const PreprocessOptions& options);

// `<output_prefix>_<key>_document`: Megatron's name for the dataset of one JSON key.
std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key);

struct PreprocessReport {
  int64_t lines = 0;                         // non-blank input lines
  int64_t blank_lines = 0;                   // skipped
  int64_t bad_lines = 0;                     // reported and skipped
  int64_t documents = 0;                     // written per key
  int64_t tokens = 0;                        // written, over all keys
  std::vector<int64_t> tokens_per_key;       // written, in --json-keys order
  std::vector<std::string> output_prefixes;  // one per JSON key, in --json-keys order
};

// Runs the conversion. Bad lines and a progress line (about once a second: documents, MB/s,
// ETA) go to `log`. Throws, leaving no output under the final names, when the input cannot be
// read, the share of bad lines exceeds max_bad_lines_fraction, or a key yields no tokens (a
// dataset that `megatron train` could draw no sample from).
PreprocessReport preprocess_data(const PreprocessOptions& options, std::ostream& log);

}  // namespace megatron::datasets
