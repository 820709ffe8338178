#include "megatron/datasets/tokenizers/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/byte_tokenizer.h"
#include "megatron/datasets/tokenizers/gpt2_bpe_tokenizer.h"
#include "megatron/datasets/tokenizers/hf_tokenizer.h"
#include "megatron/datasets/tokenizers/null_tokenizer.h"
#include "megatron/datasets/tokenizers/sentencepiece_tokenizer.h"

namespace megatron::datasets {

namespace {

// Each tokenizer names the flags it takes; any other file flag given is an error.
void check_unused(const TokenizerOptions& o, bool takes_model, bool takes_gpt2_files) {
  const auto reject = [&](const char* flag, const std::string& value) {
    MEGATRON_CHECK(value.empty(), o.type << " takes no " << flag << " but " << flag << " " << value
                                         << " was given; drop the flag or choose a tokenizer that reads it");
  };
  if (!takes_model) reject("--tokenizer-model", o.model);
  if (!takes_gpt2_files) {
    reject("--vocab-file", o.vocab_file);
    reject("--merge-file", o.merge_file);
  }
}

void check_required(const TokenizerOptions& o, const char* flag, const std::string& value, const char* what) {
  MEGATRON_CHECK(!value.empty(), o.type << " needs " << flag << " (" << what << ")");
}

// A tokenizer with its own vocabulary (fixed or from its files): --vocab-size may only repeat it.
std::unique_ptr<Tokenizer> check_vocab_size(const TokenizerOptions& o, std::unique_ptr<Tokenizer> tokenizer) {
  MEGATRON_CHECK(o.vocab_size == 0 || o.vocab_size == tokenizer->vocab_size(),
                 o.type << " has a fixed vocabulary of " << tokenizer->vocab_size() << " but --vocab-size "
                        << o.vocab_size << " was given; drop --vocab-size");
  return tokenizer;
}

std::unique_ptr<Tokenizer> make_byte(const TokenizerOptions& o) {
  check_unused(o, false, false);
  return check_vocab_size(o, std::make_unique<ByteTokenizer>());
}

std::unique_ptr<Tokenizer> make_null(const TokenizerOptions& o) {
  check_unused(o, false, false);
  return std::make_unique<NullTokenizer>(o.vocab_size);
}

std::unique_ptr<Tokenizer> make_gpt2_bpe(const TokenizerOptions& o) {
  check_unused(o, false, true);
  check_required(o, "--vocab-file", o.vocab_file, "GPT-2's vocab.json");
  check_required(o, "--merge-file", o.merge_file, "GPT-2's merges.txt");
  return check_vocab_size(o, std::make_unique<GPT2BPETokenizer>(o.vocab_file, o.merge_file));
}

std::unique_ptr<Tokenizer> make_hf(const TokenizerOptions& o) {
  check_unused(o, true, false);
  check_required(o, "--tokenizer-model", o.model, "a tokenizer.json file or the directory holding it");
  return check_vocab_size(o, std::make_unique<HuggingFaceTokenizer>(o.model));
}

template <SentencePieceTokenizer::Flavor flavor>
std::unique_ptr<Tokenizer> make_sentencepiece(const TokenizerOptions& o) {
  check_unused(o, true, false);
  check_required(o, "--tokenizer-model", o.model, "the SentencePiece tokenizer.model file");
  return check_vocab_size(o, std::make_unique<SentencePieceTokenizer>(o.model, flavor));
}

struct Entry {
  const char* type;
  const char* needs;  // the flags it takes, for the error that lists the types
  std::unique_ptr<Tokenizer> (*make)(const TokenizerOptions& options);
};

// The one list of tokenizers: the factory and its error message both read it.
constexpr Entry kTokenizers[] = {
    {"ByteTokenizer", "no files", make_byte},
    {"NullTokenizer", "--vocab-size", make_null},
    {"GPT2BPETokenizer", "--vocab-file vocab.json --merge-file merges.txt", make_gpt2_bpe},
    {"HuggingFaceTokenizer", "--tokenizer-model tokenizer.json", make_hf},
    {"SentencePieceTokenizer", "--tokenizer-model tokenizer.model",
     make_sentencepiece<SentencePieceTokenizer::Flavor::megatron>},
    {"GPTSentencePieceTokenizer", "--tokenizer-model tokenizer.model",
     make_sentencepiece<SentencePieceTokenizer::Flavor::gpt>},
    {"Llama2Tokenizer", "--tokenizer-model tokenizer.model",
     make_sentencepiece<SentencePieceTokenizer::Flavor::llama2>},
};

}  // namespace

std::vector<std::string> supported_tokenizer_types() {
  std::vector<std::string> types;
  for (const Entry& entry : kTokenizers) types.emplace_back(entry.type);
  return types;
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options) {
  for (const Entry& entry : kTokenizers) {
    if (options.type == entry.type) return entry.make(options);
  }
  std::string supported;
  for (const Entry& entry : kTokenizers) {
    supported += std::string(supported.empty() ? "" : ", ") + entry.type + " (" + entry.needs + ")";
  }
  MEGATRON_FAIL("unknown --tokenizer-type '" << options.type << "'; supported: " << supported);
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, int64_t vocab_size, const std::string& model_path) {
  TokenizerOptions options;
  options.type = type;
  options.vocab_size = vocab_size;
  options.model = model_path;
  return make_tokenizer(options);
}

std::string read_tokenizer_file(const std::string& path, const std::string& what) {
  std::error_code error;
  MEGATRON_CHECK(std::filesystem::is_regular_file(path, error),
                 what << " '" << path << "' is not a readable file; check the path");
  std::ifstream in(path, std::ios::binary);
  MEGATRON_CHECK(in.good(), what << " '" << path << "' cannot be opened; check its permissions");
  std::ostringstream content;
  content << in.rdbuf();
  MEGATRON_CHECK(!in.bad(), what << " '" << path << "' could not be read to the end");
  return content.str();
}

}  // namespace megatron::datasets
