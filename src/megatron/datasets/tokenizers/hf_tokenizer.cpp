#include "megatron/datasets/tokenizers/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <variant>

#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/bpe.h"
#include "megatron/datasets/tokenizers/pretokenize.h"

namespace megatron::datasets {

namespace {

using Json = nlohmann::json;

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, normalized;
};

// Leftmost-longest search over a set of strings: candidates start only at bytes that begin
// some token, and are tried longest first through a hash map. Added-token sets are small
// (LLaMA-3: 256) and their first bytes rare in text ('<'), so this beats a general automaton
// on simplicity at no measurable cost.
class TokenMatcher {
 public:
  explicit TokenMatcher(const std::vector<const AddedToken*>& tokens) {
    for (const AddedToken* t : tokens) {
      first_[static_cast<uint8_t>(t->content[0])] = true;
      by_content_.emplace(t->content, t);
      lengths_.push_back(t->content.size());
    }
    std::sort(lengths_.begin(), lengths_.end(), std::greater<>());
    lengths_.erase(std::unique(lengths_.begin(), lengths_.end()), lengths_.end());
  }
  bool empty() const { return by_content_.empty(); }

  // The leftmost match starting in [from, text.size()), the longest at that position.
  std::optional<std::pair<size_t, const AddedToken*>> find(std::string_view text, size_t from) const {
    for (size_t pos = from; pos < text.size(); ++pos) {
      if (!first_[static_cast<uint8_t>(text[pos])]) continue;
      for (size_t len : lengths_) {
        if (len > text.size() - pos) continue;
        const auto it = by_content_.find(text.substr(pos, len));
        if (it != by_content_.end()) return std::make_pair(pos, it->second);
      }
    }
    return std::nullopt;
  }

 private:
  std::array<bool, 256> first_{};
  std::unordered_map<std::string_view, const AddedToken*> by_content_;  // views into the owning tokens
  std::vector<size_t> lengths_;                                         // distinct, longest first
};

// The code point ending at `end` (exclusive) / starting at `begin` of valid UTF-8, with its length.
std::pair<char32_t, size_t> utf8_before(std::string_view s, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<uint8_t>(s[begin]) & 0xC0) == 0x80) --begin;
  const size_t len = end - begin;
  char32_t c = static_cast<uint8_t>(s[begin]) & (len == 1 ? 0x7F : len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = begin + 1; k < end; ++k) c = (c << 6) | (static_cast<uint8_t>(s[k]) & 0x3F);
  return {c, len};
}

std::pair<char32_t, size_t> utf8_at(std::string_view s, size_t begin) {
  const auto b = static_cast<uint8_t>(s[begin]);
  const size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  return utf8_before(s, begin + len);
}

// A literal Split pattern ({"String": ...}) as a regex: escape ASCII punctuation.
std::string escape_regex(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    const auto b = static_cast<uint8_t>(c);
    if (b < 0x80 && !std::isalnum(b)) out += '\\';
    out += c;
  }
  return out;
}

struct PrefixSpace {};  // ByteLevel add_prefix_space: prepend " " to a piece not starting with one
using PreTokenizerStep = std::variant<RegexSplitter, PrefixSpace>;

class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& problem) const {
    MEGATRON_FAIL(source_ << ": " << where << ": " << problem);
  }
  const Json& field(const Json& object, const char* key, const std::string& where) const {
    if (!object.is_object() || !object.contains(key)) fail(where, std::string("missing field \"") + key + "\"");
    return object.at(key);
  }
  // An optional boolean field: absent or null gives `otherwise`.
  bool flag(const Json& object, const char* key, bool otherwise, const std::string& where) const {
    if (!object.contains(key) || object.at(key).is_null()) return otherwise;
    if (!object.at(key).is_boolean()) fail(where + "." + key, "expected true or false, got " + object.at(key).dump());
    return object.at(key).get<bool>();
  }
  std::string string(const Json& value, const std::string& where) const {
    if (!value.is_string()) fail(where, "expected a string, got " + value.dump());
    return value.get<std::string>();
  }
  int32_t id(const Json& value, const std::string& where) const {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX) {
      fail(where, "expected a token id (a non-negative 32-bit integer), got " + value.dump());
    }
    return value.get<int32_t>();
  }
  std::string type(const Json& component, const std::string& where) const {
    return string(field(component, "type", where), where + ".type");
  }

 private:
  std::string source_;
};

}  // namespace

struct HuggingFaceTokenizer::Impl {
  std::string source;
  std::vector<TokenizerFile> files;  // as read
  std::deque<AddedToken> added;      // stable addresses for the matchers
  std::unordered_map<int32_t, const AddedToken*> added_by_id;
  std::unique_ptr<TokenMatcher> raw_matcher;         // normalized = false: matched first
  std::unique_ptr<TokenMatcher> normalized_matcher;  // normalized = true: then in the gaps
  std::vector<PreTokenizerStep> steps;
  std::unique_ptr<BytePairEncoder> bpe;
  std::vector<int32_t> prefix, suffix;  // TemplateProcessing around the text
  int64_t vocab_size = 0;
  int32_t eod = -1;
  std::optional<int32_t> bos;

  void parse_model(const Parser& p, const Json& model);
  void parse_added_tokens(const Parser& p, const Json& list);
  void parse_pre_tokenizer(const Parser& p, const Json& component, const std::string& where, bool& byte_level);
  void parse_post_processor(const Parser& p, const Json& component, const std::string& where, bool& has_template);
  std::optional<int32_t> find_id(const std::string& content) const;
  void encode_text(std::string_view text, std::vector<int32_t>& ids) const;
  void split_added(std::string_view text, const TokenMatcher& matcher,
                   std::vector<std::pair<std::string_view, const AddedToken*>>& out) const;
};

void HuggingFaceTokenizer::Impl::parse_model(const Parser& p, const Json& model) {
  const bool is_bpe =
      model.contains("type") ? p.type(model, "model") == "BPE" : model.contains("vocab") && model.contains("merges");
  if (!is_bpe) {
    p.fail("model", "unknown model type '" + (model.contains("type") ? p.type(model, "model") : "?") +
                        "'; HuggingFaceTokenizer reads byte-level BPE models only (WordPiece, WordLevel and "
                        "Unigram are not supported)");
  }
  if (model.contains("dropout") && !model.at("dropout").is_null() &&
      !(model.at("dropout").is_number() && model.at("dropout").get<double>() == 0.0)) {
    p.fail("model.dropout", "BPE dropout " + model.at("dropout").dump() + " makes encoding random; set it to null");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() && !p.string(model.at(key), key).empty()) {
      p.fail(std::string("model.") + key, "is " + model.at(key).dump() + "; byte-level BPE uses none");
    }
  }
  if (p.flag(model, "byte_fallback", false, "model")) {
    p.fail("model.byte_fallback",
           "is true: a SentencePiece-style model; use SentencePieceTokenizer with its "
           "tokenizer.model instead");
  }
  const Json& vocab_json = p.field(model, "vocab", "model");
  if (!vocab_json.is_object()) p.fail("model.vocab", "expected an object {token: id}");
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items())
    vocab.emplace_back(token, p.id(id, "model.vocab[\"" + token + "\"]"));

  const Json& merges_json = p.field(model, "merges", "model");
  if (!merges_json.is_array()) p.fail("model.merges", "expected a list");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  for (size_t k = 0; k < merges_json.size(); ++k) {
    const Json& m = merges_json[k];
    const std::string where = "model.merges[" + std::to_string(k) + "]";
    if (m.is_string()) {  // legacy "left right": exactly one space
      const std::string line = m.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        p.fail(where, "merge '" + line + "' must be two tokens separated by exactly one space");
      }
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (m.is_array() && m.size() == 2) {
      merges.emplace_back(p.string(m[0], where + "[0]"), p.string(m[1], where + "[1]"));
    } else {
      p.fail(where, "expected \"left right\" or [\"left\", \"right\"], got " + m.dump());
    }
  }
  bpe = std::make_unique<BytePairEncoder>(vocab, merges, p.flag(model, "ignore_merges", false, "model"), source);
}

void HuggingFaceTokenizer::Impl::parse_added_tokens(const Parser& p, const Json& list) {
  if (list.is_null()) return;
  if (!list.is_array()) p.fail("added_tokens", "expected a list");
  std::vector<const AddedToken*> raw, normalized;
  for (size_t k = 0; k < list.size(); ++k) {
    const Json& t = list[k];
    const std::string where = "added_tokens[" + std::to_string(k) + "]";
    AddedToken token{p.string(p.field(t, "content", where), where + ".content"),
                     p.id(p.field(t, "id", where), where + ".id"),
                     p.flag(t, "special", false, where),
                     p.flag(t, "lstrip", false, where),
                     p.flag(t, "rstrip", false, where),
                     p.flag(t, "normalized", false, where)};
    if (token.content.empty()) p.fail(where, "has empty content");
    if (p.flag(t, "single_word", false, where)) {
      p.fail(where, "token '" + token.content + "' sets single_word, which HuggingFaceTokenizer does not support");
    }
    check_utf8(token.content, where + ".content");
    added.push_back(std::move(token));
    const AddedToken* stored = &added.back();
    if (!added_by_id.emplace(stored->id, stored).second) {
      p.fail(where, "id " + std::to_string(stored->id) + " is given to two added tokens");
    }
    (stored->normalized ? normalized : raw).push_back(stored);
  }
  raw_matcher = std::make_unique<TokenMatcher>(raw);
  normalized_matcher = std::make_unique<TokenMatcher>(normalized);
}

void HuggingFaceTokenizer::Impl::parse_pre_tokenizer(const Parser& p, const Json& c, const std::string& where,
                                                     bool& byte_level) {
  const std::string type = p.type(c, where);
  if (type == "Sequence") {
    const Json& list = p.field(c, "pretokenizers", where);
    if (!list.is_array()) p.fail(where + ".pretokenizers", "expected a list");
    for (size_t k = 0; k < list.size(); ++k) {
      parse_pre_tokenizer(p, list[k], where + ".pretokenizers[" + std::to_string(k) + "]", byte_level);
    }
  } else if (type == "ByteLevel") {
    byte_level = true;
    if (p.flag(c, "add_prefix_space", false, where)) steps.emplace_back(PrefixSpace{});
    if (p.flag(c, "use_regex", true, where))
      steps.emplace_back(RegexSplitter(kGpt2SplitPattern, SplitBehavior::isolated, false));
  } else if (type == "Split") {
    const Json& pattern = p.field(c, "pattern", where);
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = p.string(pattern.at("Regex"), where + ".pattern.Regex");
    } else if (pattern.contains("String")) {
      regex = escape_regex(p.string(pattern.at("String"), where + ".pattern.String"));
    } else {
      p.fail(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}, got " + pattern.dump());
    }
    const SplitBehavior behavior = parse_split_behavior(p.string(p.field(c, "behavior", where), where + ".behavior"));
    steps.emplace_back(RegexSplitter(regex, behavior, p.flag(c, "invert", false, where)));
  } else {
    p.fail(where, "pre-tokenizer type '" + type + "' is not supported (ByteLevel, Split and Sequence are)");
  }
}

void HuggingFaceTokenizer::Impl::parse_post_processor(const Parser& p, const Json& c, const std::string& where,
                                                      bool& has_template) {
  const std::string type = p.type(c, where);
  if (type == "ByteLevel") return;  // adjusts offsets only
  if (type == "Sequence") {
    const Json& list = p.field(c, "processors", where);
    if (!list.is_array()) p.fail(where + ".processors", "expected a list");
    for (size_t k = 0; k < list.size(); ++k) {
      parse_post_processor(p, list[k], where + ".processors[" + std::to_string(k) + "]", has_template);
    }
    return;
  }
  if (type != "TemplateProcessing") {
    p.fail(where,
           "post-processor type '" + type + "' is not supported (ByteLevel, TemplateProcessing and Sequence are)");
  }
  if (has_template) p.fail(where, "a second TemplateProcessing; only one is supported");
  has_template = true;
  const Json& specials = p.field(c, "special_tokens", where);
  const Json& single = p.field(c, "single", where);
  if (!single.is_array()) p.fail(where + ".single", "expected a list");
  bool seen_text = false;
  for (size_t k = 0; k < single.size(); ++k) {
    const Json& item = single[k];
    const std::string at = where + ".single[" + std::to_string(k) + "]";
    if (item.contains("Sequence")) {
      const std::string sequence = p.string(p.field(item.at("Sequence"), "id", at + ".Sequence"), at + ".Sequence.id");
      if (sequence != "A" || seen_text) p.fail(at, "the single template must hold sequence A exactly once");
      seen_text = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name =
          p.string(p.field(item.at("SpecialToken"), "id", at + ".SpecialToken"), at + ".SpecialToken.id");
      const Json& special = p.field(specials, name.c_str(), where + ".special_tokens");
      const Json& ids = p.field(special, "ids", where + ".special_tokens." + name);
      if (!ids.is_array()) p.fail(where + ".special_tokens." + name + ".ids", "expected a list of ids");
      for (const Json& id : ids) (seen_text ? suffix : prefix).push_back(p.id(id, where + ".special_tokens." + name));
    } else {
      p.fail(at, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " + item.dump());
    }
  }
  if (!seen_text) p.fail(where + ".single", "the template has no sequence A");
}

std::optional<int32_t> HuggingFaceTokenizer::Impl::find_id(const std::string& content) const {
  for (const AddedToken& t : added) {
    if (t.content == content) return t.id;
  }
  if (const std::optional<std::string> bytes = unicode_string_to_bytes(content)) return bpe->token_id(*bytes);
  return std::nullopt;
}

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const std::filesystem::path given(path);
  const std::filesystem::path file = std::filesystem::is_directory(given) ? given / "tokenizer.json" : given;
  m.source = "HuggingFaceTokenizer " + file.string();
  m.files.push_back({"--tokenizer-model", file.string(), "tokenizer.json"});
  const Parser p(m.source);
  Json root;
  try {
    root = Json::parse(read_tokenizer_file(file.string(), "HuggingFaceTokenizer --tokenizer-model"));
  } catch (const Json::exception& e) {
    MEGATRON_FAIL(m.source << " is not valid JSON (" << e.what() << "); pass a tokenizer.json file");
  }
  if (!root.is_object()) p.fail("top level", "expected a JSON object");
  for (const char* key : {"normalizer", "truncation", "padding"}) {
    if (root.contains(key) && !root.at(key).is_null()) {
      p.fail(key, std::string("is set (") + root.at(key).dump().substr(0, 80) +
                      "), which HuggingFaceTokenizer does not support; only null is accepted");
    }
  }
  m.parse_model(p, p.field(root, "model", "top level"));
  m.parse_added_tokens(p, root.value("added_tokens", Json()));

  bool byte_level = false;
  if (root.contains("pre_tokenizer") && !root.at("pre_tokenizer").is_null()) {
    m.parse_pre_tokenizer(p, root.at("pre_tokenizer"), "pre_tokenizer", byte_level);
  }
  if (!byte_level) p.fail("pre_tokenizer", "has no ByteLevel step; HuggingFaceTokenizer reads byte-level BPE only");
  const Json& decoder = p.field(root, "decoder", "top level");
  if (decoder.is_null() || p.type(decoder, "decoder") != "ByteLevel") {
    p.fail("decoder", "must be ByteLevel for byte-level BPE, got " + decoder.dump().substr(0, 80));
  }
  bool has_template = false;
  if (root.contains("post_processor") && !root.at("post_processor").is_null()) {
    m.parse_post_processor(p, root.at("post_processor"), "post_processor", has_template);
  }

  int64_t max_id = m.bpe->max_id();
  for (const AddedToken& t : m.added) max_id = std::max<int64_t>(max_id, t.id);
  m.vocab_size = max_id + 1;
  for (int32_t id : m.prefix)
    MEGATRON_CHECK(id <= max_id, m.source << ": template id " << id << " is outside the vocabulary");
  for (int32_t id : m.suffix)
    MEGATRON_CHECK(id <= max_id, m.source << ": template id " << id << " is outside the vocabulary");

  // transformers takes eos/bos from tokenizer_config.json; without one, the usual names.
  std::optional<std::string> eos_name, bos_name;
  const std::filesystem::path config = file.parent_path() / "tokenizer_config.json";
  if (std::filesystem::is_regular_file(config)) {
    m.files.push_back({"", config.string(), "tokenizer_config.json"});
    Json c;
    try {
      c = Json::parse(read_tokenizer_file(config.string(), "HuggingFaceTokenizer config"));
    } catch (const Json::exception& e) {
      MEGATRON_FAIL(config.string() << " is not valid JSON (" << e.what() << ")");
    }
    const auto name_of = [&](const char* key) -> std::optional<std::string> {
      if (!c.contains(key) || c.at(key).is_null()) return std::nullopt;
      const Json& v = c.at(key);
      return v.is_object() ? Parser(config.string()).string(v.value("content", Json()), key)
                           : Parser(config.string()).string(v, key);
    };
    eos_name = name_of("eos_token");
    bos_name = name_of("bos_token");
  }
  const auto resolve = [&](const std::optional<std::string>& configured, std::initializer_list<const char*> usual,
                           const char* what) -> std::optional<int32_t> {
    if (configured) {
      const std::optional<int32_t> id = m.find_id(*configured);
      MEGATRON_CHECK(id.has_value(), config.string() << ": " << what << " '" << *configured
                                                     << "' is not in the vocabulary of " << file.string());
      return id;
    }
    for (const char* name : usual) {
      if (const std::optional<int32_t> id = m.find_id(name)) return id;
    }
    return std::nullopt;
  };
  const std::optional<int32_t> eod = resolve(eos_name, {"<|end_of_text|>", "<|endoftext|>", "</s>"}, "eos_token");
  MEGATRON_CHECK(eod.has_value(), m.source << " has no end-of-document token (none of <|end_of_text|>, "
                                           << "<|endoftext|>, </s>); put a tokenizer_config.json naming "
                                           << "eos_token beside it");
  m.eod = *eod;
  m.bos = resolve(bos_name, {"<|begin_of_text|>", "<s>"}, "bos_token");
}

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

// Cuts text at the matches of `matcher`, applying lstrip/rstrip (which swallow the adjacent
// White_Space into the token). Pieces with a token are the token; the others are text.
void HuggingFaceTokenizer::Impl::split_added(std::string_view text, const TokenMatcher& matcher,
                                             std::vector<std::pair<std::string_view, const AddedToken*>>& out) const {
  size_t done = 0;
  size_t from = 0;
  while (const auto match = matcher.find(text, from)) {
    const AddedToken* token = match->second;
    size_t begin = match->first;
    size_t end = begin + token->content.size();
    if (token->lstrip) {
      while (begin > done) {
        const auto [c, len] = utf8_before(text, begin);
        if (!is_unicode_white_space(c)) break;
        begin -= len;
      }
    }
    if (token->rstrip) {
      while (end < text.size()) {
        const auto [c, len] = utf8_at(text, end);
        if (!is_unicode_white_space(c)) break;
        end += len;
      }
    }
    if (begin > done) out.emplace_back(text.substr(done, begin - done), nullptr);
    out.emplace_back(text.substr(begin, end - begin), token);
    done = from = end;
  }
  if (done < text.size()) out.emplace_back(text.substr(done), nullptr);
}

void HuggingFaceTokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::string_view> pieces{text}, next;
  std::deque<std::string> prefixed;  // storage for pieces that gained a leading space
  for (const PreTokenizerStep& step : steps) {
    next.clear();
    if (const auto* splitter = std::get_if<RegexSplitter>(&step)) {
      for (std::string_view piece : pieces) splitter->split(piece, next);
    } else {
      for (std::string_view piece : pieces) {
        if (!piece.empty() && piece.front() == ' ') {
          next.push_back(piece);
        } else {
          next.push_back(prefixed.emplace_back(" " + std::string(piece)));
        }
      }
    }
    pieces.swap(next);
  }
  for (std::string_view piece : pieces) bpe->encode_word(piece, ids);
}

std::vector<int32_t> HuggingFaceTokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  check_utf8(text, "HuggingFaceTokenizer input");
  std::vector<int32_t> ids(m.prefix);
  ids.reserve(text.size() / 3 + m.prefix.size() + m.suffix.size());
  std::vector<std::pair<std::string_view, const AddedToken*>> first, second;
  if (m.raw_matcher == nullptr || m.raw_matcher->empty()) {
    first.emplace_back(text, nullptr);
  } else {
    m.split_added(text, *m.raw_matcher, first);
  }
  for (const auto& [piece, token] : first) {
    if (token != nullptr || m.normalized_matcher == nullptr || m.normalized_matcher->empty()) {
      second.emplace_back(piece, token);
    } else {
      m.split_added(piece, *m.normalized_matcher, second);
    }
  }
  for (const auto& [piece, token] : second) {
    if (token != nullptr) {
      ids.push_back(token->id);
    } else {
      m.encode_text(piece, ids);
    }
  }
  ids.insert(ids.end(), m.suffix.begin(), m.suffix.end());
  return ids;
}

std::string HuggingFaceTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  std::string text;
  for (int32_t id : ids) {
    const auto added = m.added_by_id.find(id);
    if (added != m.added_by_id.end()) {
      // The ByteLevel decoder maps a token's characters back to bytes when all are stand-ins,
      // and keeps its UTF-8 otherwise.
      text += unicode_string_to_bytes(added->second->content).value_or(added->second->content);
      continue;
    }
    const std::optional<std::string_view> bytes = m.bpe->token_bytes(id);
    MEGATRON_CHECK(bytes.has_value(), m.source << " cannot decode id " << id << ": no token has it (vocabulary size "
                                               << m.vocab_size << ")");
    text += *bytes;
  }
  return text;
}

int64_t HuggingFaceTokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t HuggingFaceTokenizer::eod() const { return impl_->eod; }
std::optional<int32_t> HuggingFaceTokenizer::bos() const { return impl_->bos; }
std::vector<TokenizerFile> HuggingFaceTokenizer::files() const { return impl_->files; }

std::vector<SpecialToken> HuggingFaceTokenizer::special_tokens() const {
  std::vector<SpecialToken> out;
  for (const AddedToken& t : impl_->added) {
    if (t.special) out.push_back({t.content, t.id});
  }
  return out;
}

}  // namespace megatron::datasets
