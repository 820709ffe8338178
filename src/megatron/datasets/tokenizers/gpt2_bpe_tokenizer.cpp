#include "megatron/datasets/tokenizers/gpt2_bpe_tokenizer.h"

#include <nlohmann/json.hpp>

#include "megatron/core/error.h"

namespace megatron::datasets {

namespace {

std::vector<std::pair<std::string, int32_t>> load_vocab(const std::string& path) {
  const std::string text = read_tokenizer_file(path, "GPT2BPETokenizer --vocab-file");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL("GPT2BPETokenizer --vocab-file " << path << " is not valid JSON (" << e.what()
                                                   << "); pass GPT-2's vocab.json");
  }
  MEGATRON_CHECK(json.is_object(), "GPT2BPETokenizer --vocab-file " << path << " must hold a JSON object {token: id}; "
                                                                    << "pass GPT-2's vocab.json");
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(json.size());
  for (const auto& [token, id] : json.items()) {
    MEGATRON_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT32_MAX,
                   "GPT2BPETokenizer --vocab-file " << path << ": token '" << token << "' has id " << id.dump()
                                                    << ", not a non-negative 32-bit integer");
    vocab.emplace_back(token, id.get<int32_t>());
  }
  return vocab;
}

// merges.txt: an optional "#version" first line, then one "left right" pair per line.
std::vector<std::pair<std::string, std::string>> load_merges(const std::string& path) {
  const std::string text = read_tokenizer_file(path, "GPT2BPETokenizer --merge-file");
  std::vector<std::pair<std::string, std::string>> merges;
  size_t begin = 0;
  for (int64_t line_number = 1; begin < text.size(); ++line_number) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    MEGATRON_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                       line.find(' ', space + 1) == std::string_view::npos,
                   "GPT2BPETokenizer --merge-file " << path << " line " << line_number << " is '" << line
                                                    << "'; every line must be two tokens separated by one space");
    merges.emplace_back(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
  }
  return merges;
}

}  // namespace

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file)
    : GPT2BPETokenizer(BytePairEncoder(load_vocab(vocab_file), load_merges(merge_file), /*ignore_merges=*/false,
                                       "GPT2BPETokenizer files " + vocab_file + " and " + merge_file),
                       vocab_file, merge_file) {}

GPT2BPETokenizer::GPT2BPETokenizer(BytePairEncoder bpe, std::string vocab_file, std::string merge_file)
    : vocab_file_(std::move(vocab_file)),
      merge_file_(std::move(merge_file)),
      bpe_(std::move(bpe)),
      splitter_(kGpt2SplitPattern, SplitBehavior::isolated, false),
      eod_(-1) {
  const std::optional<int32_t> eod = bpe_.token_id(kEndOfText);
  MEGATRON_CHECK(eod.has_value(), "GPT2BPETokenizer vocabulary has no token " << kEndOfText
                                                                              << ", Megatron's end of document; "
                                                                              << "pass GPT-2's vocab.json");
  eod_ = *eod;
}

std::vector<TokenizerFile> GPT2BPETokenizer::files() const {
  return {{"--vocab-file", vocab_file_, "vocab.json"}, {"--merge-file", merge_file_, "merges.txt"}};
}

std::vector<int32_t> GPT2BPETokenizer::encode(std::string_view text) const {
  check_utf8(text, "GPT2BPETokenizer input");
  std::vector<std::string_view> words;
  splitter_.split(text, words);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  for (std::string_view word : words) bpe_.encode_word(word, ids);
  return ids;
}

std::string GPT2BPETokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    const std::optional<std::string_view> bytes = bpe_.token_bytes(id);
    MEGATRON_CHECK(bytes.has_value(), "GPT2BPETokenizer cannot decode id " << id << ": the vocabulary has ids [0, "
                                                                           << bpe_.max_id() + 1 << ")");
    text += *bytes;
  }
  return text;
}

}  // namespace megatron::datasets
