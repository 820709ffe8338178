#include "megatron/datasets/tokenizers/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>

#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/pretokenize.h"

namespace megatron::datasets {

struct SentencePieceTokenizer::Impl {
  std::string source;
  std::string model_file;
  Flavor flavor = Flavor::megatron;
  sentencepiece::SentencePieceProcessor processor;
  int64_t vocab_size = 0;
  int32_t eod = -1;
  std::optional<int32_t> bos;
  std::vector<SpecialToken> specials;  // megatron flavor, in Megatron's order (its tie-break)

  std::vector<int32_t> encode_plain(std::string_view text) const {
    std::vector<int> ids;
    const auto status = processor.Encode(text, &ids);
    MEGATRON_CHECK(status.ok(), source << " failed to encode: " << status.ToString());
    return {ids.begin(), ids.end()};
  }
  std::string decode_plain(const std::vector<int32_t>& ids) const {
    for (int32_t id : ids) {
      MEGATRON_CHECK(id >= 0 && id < processor.GetPieceSize(), source << " cannot decode id " << id
                                                                      << ": the model has ids [0, "
                                                                      << processor.GetPieceSize() << ")");
    }
    std::string text;
    const auto status = processor.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    MEGATRON_CHECK(status.ok(), source << " failed to decode: " << status.ToString());
    return text;
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, Flavor flavor)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.flavor = flavor;
  m.source = name() + " " + model_file;
  m.model_file = model_file;
  const std::string bytes = read_tokenizer_file(model_file, name() + " --tokenizer-model");
  const auto status = m.processor.LoadFromSerializedProto(bytes);
  MEGATRON_CHECK(status.ok(), m.source << " is not a SentencePiece model (" << status.ToString()
                                       << "); pass the tokenizer.model file");
  const int pieces = m.processor.GetPieceSize();
  m.vocab_size = pieces;
  const auto piece_or = [&](int id, const char* fallback) {
    return id >= 0 && id < pieces ? m.processor.IdToPiece(id) : std::string(fallback);
  };
  if (flavor == Flavor::megatron) {
    // Megatron's _SentencePieceTokenizer: a token already in the vocabulary keeps its id, a new
    // one takes the next id.
    const auto add = [&](const std::string& content) {
      const int existing = m.processor.PieceToId(content);
      const bool present = existing != m.processor.unk_id() || content == piece_or(m.processor.unk_id(), "");
      const int32_t id = present ? existing : int32_t(m.vocab_size++);
      if (std::none_of(m.specials.begin(), m.specials.end(),
                       [&](const SpecialToken& t) { return t.content == content; })) {
        m.specials.push_back({content, id});
      }
      return id;
    };
    add("<CLS>");
    add("<SEP>");
    m.eod = add("<EOD>");
    add("<MASK>");
    add(piece_or(m.processor.pad_id(), "<PAD>"));
    m.bos = add(piece_or(m.processor.bos_id(), "<BOS>"));
    add(piece_or(m.processor.eos_id(), "<EOS>"));
    return;
  }
  const int eos = m.processor.eos_id();
  MEGATRON_CHECK(eos >= 0 && eos < pieces, m.source << " has no eos piece (eos_id " << eos << "), which " << name()
                                                    << " uses as end of document; use SentencePieceTokenizer");
  m.eod = eos;
  const int bos = m.processor.bos_id();
  if (bos >= 0 && bos < pieces) m.bos = bos;
  MEGATRON_CHECK(flavor != Flavor::llama2 || m.bos.has_value(),
                 m.source << " has no bos piece (bos_id " << bos << "), which Llama2Tokenizer puts first");
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  check_utf8(text, name() + " input");
  if (m.flavor == Flavor::gpt) return m.encode_plain(text);
  if (m.flavor == Flavor::llama2) {
    std::vector<int32_t> ids{*m.bos};
    const std::vector<int32_t> body = m.encode_plain(text);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }
  // Cut at the earliest special token; on a tie the first in Megatron's order wins.
  std::vector<int32_t> ids;
  size_t done = 0;
  while (true) {
    size_t best = std::string_view::npos;
    const SpecialToken* token = nullptr;
    for (const SpecialToken& t : m.specials) {
      const size_t at = text.find(t.content, done);
      if (at < best) best = at, token = &t;
    }
    if (token == nullptr) break;
    const std::vector<int32_t> piece = m.encode_plain(text.substr(done, best - done));
    ids.insert(ids.end(), piece.begin(), piece.end());
    ids.push_back(token->id);
    done = best + token->content.size();
  }
  const std::vector<int32_t> rest = m.encode_plain(text.substr(done));
  ids.insert(ids.end(), rest.begin(), rest.end());
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  if (m.flavor != Flavor::megatron) return m.decode_plain(ids);
  std::string text;
  std::vector<int32_t> run;
  for (int32_t id : ids) {
    const auto special =
        std::find_if(m.specials.begin(), m.specials.end(), [&](const SpecialToken& t) { return t.id == id; });
    if (special == m.specials.end()) {
      run.push_back(id);
      continue;
    }
    text += m.decode_plain(run) + " " + special->content + " ";
    run.clear();
  }
  return text + m.decode_plain(run);
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t SentencePieceTokenizer::eod() const { return impl_->eod; }
std::optional<int32_t> SentencePieceTokenizer::bos() const { return impl_->bos; }

std::string SentencePieceTokenizer::name() const {
  switch (impl_->flavor) {
    case Flavor::megatron:
      return "SentencePieceTokenizer";
    case Flavor::gpt:
      return "GPTSentencePieceTokenizer";
    case Flavor::llama2:
      return "Llama2Tokenizer";
  }
  return "";
}

std::vector<SpecialToken> SentencePieceTokenizer::special_tokens() const { return impl_->specials; }
std::vector<TokenizerFile> SentencePieceTokenizer::files() const {
  return {{"--tokenizer-model", impl_->model_file, "tokenizer.model"}};
}

}  // namespace megatron::datasets
