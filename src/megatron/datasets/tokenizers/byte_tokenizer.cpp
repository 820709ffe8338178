#include "megatron/datasets/tokenizers/byte_tokenizer.h"

#include "megatron/core/error.h"

namespace megatron::datasets {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t k = 0; k < text.size(); ++k) ids[k] = int32_t(static_cast<unsigned char>(text[k]));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    MEGATRON_CHECK(id >= 0,
                   "ByteTokenizer cannot decode negative id " << id << "; ids lie in [0, " << kVocabSize << ")");
    if (id < 256) text.push_back(static_cast<char>(id));
  }
  return text;
}

}  // namespace megatron::datasets
