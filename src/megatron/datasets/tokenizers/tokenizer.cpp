#include "megatron/datasets/tokenizers/tokenizer.h"

#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/byte_tokenizer.h"
#include "megatron/datasets/tokenizers/null_tokenizer.h"

namespace megatron::datasets {

namespace {

void check_no_model(const std::string& type, const std::string& model_path) {
  MEGATRON_CHECK(model_path.empty(), type << " takes no tokenizer model but --tokenizer-model " << model_path
                                          << " was given; drop the flag or choose a tokenizer that reads a model");
}

std::unique_ptr<Tokenizer> make_byte(int64_t vocab_size, const std::string& model_path) {
  check_no_model("ByteTokenizer", model_path);
  MEGATRON_CHECK(vocab_size == 0 || vocab_size == ByteTokenizer::kVocabSize,
                 "ByteTokenizer has a fixed vocabulary of " << ByteTokenizer::kVocabSize << " but --vocab-size "
                                                            << vocab_size << " was given; drop --vocab-size");
  return std::make_unique<ByteTokenizer>();
}

std::unique_ptr<Tokenizer> make_null(int64_t vocab_size, const std::string& model_path) {
  check_no_model("NullTokenizer", model_path);
  return std::make_unique<NullTokenizer>(vocab_size);
}

struct Entry {
  const char* type;
  std::unique_ptr<Tokenizer> (*make)(int64_t vocab_size, const std::string& model_path);
};

// The one list of tokenizers: the factory and its error message both read it.
constexpr Entry kTokenizers[] = {
    {"ByteTokenizer", make_byte},
    {"NullTokenizer", make_null},
};

}  // namespace

std::vector<std::string> supported_tokenizer_types() {
  std::vector<std::string> types;
  for (const Entry& entry : kTokenizers) types.emplace_back(entry.type);
  return types;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, int64_t vocab_size, const std::string& model_path) {
  for (const Entry& entry : kTokenizers) {
    if (type == entry.type) return entry.make(vocab_size, model_path);
  }
  std::string supported;
  for (const Entry& entry : kTokenizers) supported += std::string(supported.empty() ? "" : ", ") + entry.type;
  MEGATRON_FAIL("unknown --tokenizer-type '" << type << "'; supported: " << supported);
}

}  // namespace megatron::datasets
