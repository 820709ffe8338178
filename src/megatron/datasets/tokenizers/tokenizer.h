#pragma once
// Text <-> token ids. Implementations are immutable after construction, so one instance may
// encode from many threads at once (preprocess-data relies on this).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::datasets {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // unpadded: ids lie in [0, vocab_size)
  virtual int32_t eod() const = 0;         // end-of-document id, appended by --append-eod
  virtual std::string name() const = 0;    // the --tokenizer-type that builds it
};

// The tokenizer named by Megatron's --tokenizer-type. vocab_size is --vocab-size (0 when not
// given) and model_path is --tokenizer-model (empty when not given); a tokenizer that takes
// neither rejects them rather than ignoring them. Unknown types throw an Error listing the
// supported ones.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, int64_t vocab_size, const std::string& model_path);

// The supported --tokenizer-type values, in the order the factory lists them.
std::vector<std::string> supported_tokenizer_types();

}  // namespace megatron::datasets
