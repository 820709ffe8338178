#pragma once
// Text <-> token ids. Implementations are immutable after construction, so one instance may
// encode from many threads at once (preprocess-data relies on this).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::datasets {

// A token written in text as `content` that encodes to `id` as a whole (e.g. <|endoftext|>).
struct SpecialToken {
  std::string content;
  int32_t id;
  bool operator==(const SpecialToken&) const = default;
};

// A file a tokenizer was read from.
struct TokenizerFile {
  std::string flag;  // the flag that names it (--vocab-file, --merge-file, --tokenizer-model), or ""
                     // for a file read from beside another (a tokenizer.json's tokenizer_config.json)
  std::string path;  // as read
  std::string name;  // its name in a directory of the tokenizer's own: vocab.json, merges.txt,
                     // tokenizer.json, tokenizer_config.json, tokenizer.model
  bool operator==(const TokenizerFile&) const = default;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text tokenizers (all but ByteTokenizer and NullTokenizer) take UTF-8 and throw an Error
  // naming the offset of the first invalid byte, as Megatron fails on undecodable input.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // unpadded: ids lie in [0, vocab_size)
  virtual int32_t eod() const = 0;         // end-of-document id, appended by --append-eod
  virtual std::string name() const = 0;    // the --tokenizer-type that builds it
  // The beginning-of-sequence id, for tokenizers that have one.
  virtual std::optional<int32_t> bos() const { return std::nullopt; }
  // Tokens that encode() recognises whole in the text.
  virtual std::vector<SpecialToken> special_tokens() const { return {}; }
  // The files it was read from (none for ByteTokenizer and NullTokenizer). Copied into one
  // directory under their names, they give the same tokenizer through tokenizer_options_in: how a
  // checkpoint keeps its tokenizer.
  virtual std::vector<TokenizerFile> files() const { return {}; }
};

// The tokenizer flags of Megatron's command line; empty / 0 when not given.
struct TokenizerOptions {
  std::string type;        // --tokenizer-type
  int64_t vocab_size = 0;  // --vocab-size
  std::string model;       // --tokenizer-model: tokenizer.json (or its directory) or a SentencePiece .model
  std::string vocab_file;  // --vocab-file: GPT-2 vocab.json
  std::string merge_file;  // --merge-file: GPT-2 merges.txt
  // TikTokenizer's (tiktoken_tokenizer.h); unset: Megatron's defaults (v2, 1000, its seven tokens).
  std::string tiktoken_pattern;             // --tiktoken-pattern: v1 | v2
  int64_t tiktoken_num_special_tokens = 0;  // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;  // --special-tokens
};

// The tokenizer named by Megatron's --tokenizer-type. A tokenizer rejects the flags it does not
// take rather than ignoring them, and names the flags it lacks. Unknown types throw an Error
// listing the supported ones with the flags each needs.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options);

// Shorthand for callers that have no --vocab-file / --merge-file.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, int64_t vocab_size, const std::string& model_path);

// Whether `options` give every flag their --tokenizer-type reads (--vocab-size for
// NullTokenizer, the file flags for the others); false without a known type.
bool tokenizer_options_complete(const TokenizerOptions& options);

// `given` (a command line's tokenizer flags) completed from `saved` (those a checkpoint's tokenizer
// was built from), the command line taking precedence as in Megatron: with no --tokenizer-type or
// the saved one, each flag not given takes its saved value; another type is taken as given.
TokenizerOptions complete_tokenizer_options(const TokenizerOptions& given, const TokenizerOptions& saved);

// `options` with the flag of each of `files` naming <directory>/<name>: the tokenizer built from
// `files` copied into `directory`.
TokenizerOptions tokenizer_options_in(TokenizerOptions options, const std::vector<TokenizerFile>& files,
                                      const std::string& directory);

// The supported --tokenizer-type values, in the order the factory lists them.
std::vector<std::string> supported_tokenizer_types();

// The whole content of a tokenizer's file; throws naming `what` (e.g. "GPT2BPETokenizer
// --merge-file") and the path when it cannot be read.
std::string read_tokenizer_file(const std::string& path, const std::string& what);

}  // namespace megatron::datasets
