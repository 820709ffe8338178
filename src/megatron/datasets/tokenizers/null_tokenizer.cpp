#include "megatron/datasets/tokenizers/null_tokenizer.h"

#include <charconv>
#include <limits>

#include "megatron/core/error.h"

namespace megatron::datasets {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

NullTokenizer::NullTokenizer(int64_t vocab_size) : vocab_size_(vocab_size) {
  MEGATRON_CHECK(
      vocab_size >= 1 && vocab_size - 1 <= std::numeric_limits<int32_t>::max(),
      "NullTokenizer needs --vocab-size in [1, 2^31], got " << vocab_size << "; pass the model's vocabulary size");
}

std::vector<int32_t> NullTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    if (is_space(text[pos])) {
      ++pos;
      continue;
    }
    size_t end = pos;
    while (end < text.size() && !is_space(text[end])) ++end;
    const std::string_view word = text.substr(pos, end - pos);
    // Python's int() accepts a leading '+'; from_chars does not.
    const size_t skip = word.front() == '+' && word.size() > 1 ? 1 : 0;
    int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(word.data() + skip, word.data() + word.size(), value);
    MEGATRON_CHECK(ec == std::errc() && ptr == word.data() + word.size(),
                   "NullTokenizer input must be whitespace-separated integers, found '" << word << "'");
    MEGATRON_CHECK(value >= 0 && value < vocab_size_, "NullTokenizer id " << value << " is outside the vocabulary [0, "
                                                                          << vocab_size_
                                                                          << "); raise --vocab-size or fix the input");
    ids.push_back(int32_t(value));
    pos = end;
  }
  return ids;
}

std::string NullTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k > 0) text.push_back(' ');
    text += std::to_string(ids[k]);
  }
  return text;
}

}  // namespace megatron::datasets
