#include "megatron/datasets/tokenizers/tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/byte_tokenizer.h"
#include "megatron/datasets/tokenizers/gpt2_bpe_tokenizer.h"
#include "megatron/datasets/tokenizers/hf_tokenizer.h"
#include "megatron/datasets/tokenizers/null_tokenizer.h"
#include "megatron/datasets/tokenizers/sentencepiece_tokenizer.h"
#include "megatron/datasets/tokenizers/tiktoken_tokenizer.h"

namespace megatron::datasets {

namespace {

// The flags that name a tokenizer's files.
struct FileFlag {
  const char* flag;
  std::string TokenizerOptions::*field;
};
constexpr FileFlag kFileFlags[] = {{"--tokenizer-model", &TokenizerOptions::model},
                                   {"--vocab-file", &TokenizerOptions::vocab_file},
                                   {"--merge-file", &TokenizerOptions::merge_file}};

std::string TokenizerOptions::*file_field(const std::string& flag) {
  for (const FileFlag& f : kFileFlags)
    if (flag == f.flag) return f.field;
  MEGATRON_FAIL("'" << flag << "' is not a tokenizer file flag; those are --tokenizer-model, --vocab-file and "
                    << "--merge-file");
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
  return check_vocab_size(o, std::make_unique<ByteTokenizer>());
}

std::unique_ptr<Tokenizer> make_null(const TokenizerOptions& o) {
  return std::make_unique<NullTokenizer>(o.vocab_size);
}

std::unique_ptr<Tokenizer> make_gpt2_bpe(const TokenizerOptions& o) {
  check_required(o, "--vocab-file", o.vocab_file, "GPT-2's vocab.json");
  check_required(o, "--merge-file", o.merge_file, "GPT-2's merges.txt");
  return check_vocab_size(o, std::make_unique<GPT2BPETokenizer>(o.vocab_file, o.merge_file));
}

std::unique_ptr<Tokenizer> make_hf(const TokenizerOptions& o) {
  check_required(o, "--tokenizer-model", o.model, "a tokenizer.json file or the directory holding it");
  return check_vocab_size(o, std::make_unique<HuggingFaceTokenizer>(o.model));
}

template <SentencePieceTokenizer::Flavor flavor>
std::unique_ptr<Tokenizer> make_sentencepiece(const TokenizerOptions& o) {
  check_required(o, "--tokenizer-model", o.model, "the SentencePiece tokenizer.model file");
  return check_vocab_size(o, std::make_unique<SentencePieceTokenizer>(o.model, flavor));
}

// TikTokenizer's vocabulary size is a choice (the first vocab_size - specials ranks), Megatron's
// default 131072.
std::unique_ptr<Tokenizer> make_tiktoken(const TokenizerOptions& o) {
  check_required(o, "--tokenizer-model", o.model, "the tiktoken vocabulary JSON");
  TikTokenizerOptions t;
  if (!o.tiktoken_pattern.empty()) t.pattern = o.tiktoken_pattern;
  if (o.tiktoken_num_special_tokens != 0) t.num_special_tokens = o.tiktoken_num_special_tokens;
  if (!o.special_tokens.empty()) t.special_tokens = o.special_tokens;
  if (o.vocab_size != 0) t.vocab_size = o.vocab_size;
  return std::make_unique<TikTokenizer>(o.model, t);
}

struct Entry {
  const char* type;
  const char* needs;  // the flags it takes, for the error that lists the types
  std::unique_ptr<Tokenizer> (*make)(const TokenizerOptions& options);
  std::array<const char*, 2> reads;  // the flags it reads besides --tokenizer-type (nullptr: none)

  bool reads_flag(const std::string& flag) const {
    return std::any_of(reads.begin(), reads.end(), [&](const char* f) { return f != nullptr && flag == f; });
  }
};

// The one list of tokenizers: the factory, its error message and the flag rules all read it.
constexpr Entry kTokenizers[] = {
    {"ByteTokenizer", "no files", make_byte, {}},
    {"NullTokenizer", "--vocab-size", make_null, {"--vocab-size"}},
    {"GPT2BPETokenizer",
     "--vocab-file vocab.json --merge-file merges.txt",
     make_gpt2_bpe,
     {"--vocab-file", "--merge-file"}},
    {"HuggingFaceTokenizer", "--tokenizer-model tokenizer.json", make_hf, {"--tokenizer-model"}},
    {"SentencePieceTokenizer",
     "--tokenizer-model tokenizer.model",
     make_sentencepiece<SentencePieceTokenizer::Flavor::megatron>,
     {"--tokenizer-model"}},
    {"GPTSentencePieceTokenizer",
     "--tokenizer-model tokenizer.model",
     make_sentencepiece<SentencePieceTokenizer::Flavor::gpt>,
     {"--tokenizer-model"}},
    {"Llama2Tokenizer",
     "--tokenizer-model tokenizer.model",
     make_sentencepiece<SentencePieceTokenizer::Flavor::llama2>,
     {"--tokenizer-model"}},
    {"TikTokenizer", "--tokenizer-model vocab.json", make_tiktoken, {"--tokenizer-model"}},
};

const Entry* find_entry(const std::string& type) {
  for (const Entry& entry : kTokenizers)
    if (type == entry.type) return &entry;
  return nullptr;
}

// A tokenizer rejects the file flags it does not read rather than ignoring them, and the
// TikTokenizer's own flags unless it is one.
void check_unused(const TokenizerOptions& o, const Entry& entry) {
  if (o.type != "TikTokenizer") {
    const char* given = !o.tiktoken_pattern.empty()          ? "--tiktoken-pattern"
                        : o.tiktoken_num_special_tokens != 0 ? "--tiktoken-num-special-tokens"
                        : !o.special_tokens.empty()          ? "--special-tokens"
                                                             : nullptr;
    MEGATRON_CHECK(given == nullptr, o.type << " takes no " << given << " (TikTokenizer's); drop the flag");
  }
  for (const FileFlag& f : kFileFlags) {
    const std::string& value = o.*f.field;
    MEGATRON_CHECK(value.empty() || entry.reads_flag(f.flag),
                   o.type << " takes no " << f.flag << " but " << f.flag << " " << value
                          << " was given; drop the flag or choose a tokenizer that reads it");
  }
}

}  // namespace

std::vector<std::string> supported_tokenizer_types() {
  std::vector<std::string> types;
  for (const Entry& entry : kTokenizers) types.emplace_back(entry.type);
  return types;
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options) {
  if (const Entry* entry = find_entry(options.type)) {
    check_unused(options, *entry);
    return entry->make(options);
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

bool tokenizer_options_complete(const TokenizerOptions& options) {
  const Entry* entry = find_entry(options.type);
  if (entry == nullptr) return false;
  for (const char* flag : entry->reads) {
    if (flag == nullptr) continue;
    const bool given =
        std::string(flag) == "--vocab-size" ? options.vocab_size != 0 : !(options.*file_field(flag)).empty();
    if (!given) return false;
  }
  return true;
}

TokenizerOptions complete_tokenizer_options(const TokenizerOptions& given, const TokenizerOptions& saved) {
  if (!given.type.empty() && given.type != saved.type) return given;
  TokenizerOptions o = saved;
  if (given.vocab_size != 0) o.vocab_size = given.vocab_size;
  for (const FileFlag& f : kFileFlags)
    if (!(given.*f.field).empty()) o.*f.field = given.*f.field;
  if (!given.tiktoken_pattern.empty()) o.tiktoken_pattern = given.tiktoken_pattern;
  if (given.tiktoken_num_special_tokens != 0) o.tiktoken_num_special_tokens = given.tiktoken_num_special_tokens;
  if (!given.special_tokens.empty()) o.special_tokens = given.special_tokens;
  return o;
}

TokenizerOptions tokenizer_options_in(TokenizerOptions options, const std::vector<TokenizerFile>& files,
                                      const std::string& directory) {
  for (const TokenizerFile& file : files)
    if (!file.flag.empty()) options.*file_field(file.flag) = (std::filesystem::path(directory) / file.name).string();
  return options;
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
