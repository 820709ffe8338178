#include "megatron/datasets/tokenizers/tiktoken_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "megatron/core/error.h"

namespace megatron::datasets {

namespace {

// Megatron's two split patterns (_PATTERN_TIKTOKEN_V1 / _V2).
constexpr const char* kPatternV1 =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
constexpr const char* kPatternV2 =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string split_pattern(const std::string& name) {
  if (name == "v1") return kPatternV1;
  if (name == "v2") return kPatternV2;
  MEGATRON_FAIL("TikTokenizer --tiktoken-pattern " << name << ": Megatron's patterns are v1 and v2");
}

// Standard base64 (RFC 4648, with padding), as Python's b64decode reads the vocabulary's
// token_bytes; nullopt for malformed text.
std::optional<std::string> base64_decode(const std::string& text) {
  const auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + size_t(k)];
      const bool last_group = i + 4 == text.size();
      if (c == '=' && last_group && k >= 2 && (k == 3 || text[i + 3] == '=')) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (v[k] = value(c)) < 0) return std::nullopt;
    }
    const uint32_t bits = uint32_t(v[0]) << 18 | uint32_t(v[1]) << 12 | uint32_t(v[2]) << 6 | uint32_t(v[3]);
    out += char(bits >> 16);
    if (pad < 2) out += char((bits >> 8) & 0xFF);
    if (pad < 1) out += char(bits & 0xFF);
  }
  return out;
}

// Megatron's reload_mergeable_ranks: the first `count` entries' bytes, by rank.
std::vector<std::string> load_ranks(const std::string& path, int64_t count) {
  const std::string where = "TikTokenizer --tokenizer-model " + path;
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_tokenizer_file(path, "TikTokenizer --tokenizer-model"));
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL(where << " is not valid JSON (" << e.what() << "); pass the tokenizer's vocabulary JSON");
  }
  MEGATRON_CHECK(json.is_array(), where << " must hold a JSON list of {\"rank\", \"token_bytes\", \"token_str\"}");
  MEGATRON_CHECK(int64_t(json.size()) >= count,
                 where << " holds " << json.size() << " tokens, but --vocab-size less the special tokens needs "
                       << count << "; lower --vocab-size or --tiktoken-num-special-tokens");
  std::vector<std::string> tokens;
  tokens.reserve(size_t(count));
  for (int64_t i = 0; i < count; ++i) {
    const nlohmann::json& entry = json[size_t(i)];
    MEGATRON_CHECK(entry.is_object() && entry.size() == 3 && entry.contains("rank") && entry.contains("token_bytes") &&
                       entry.contains("token_str"),
                   where << ": entry " << i << " is " << entry.dump().substr(0, 200)
                         << "; each must be {\"rank\", \"token_bytes\", \"token_str\"} and nothing else");
    MEGATRON_CHECK(entry["rank"].is_number_integer() && entry["rank"].get<int64_t>() == i,
                   where << ": entry " << i << " has rank " << entry["rank"].dump() << "; entry i must have rank i");
    const std::optional<std::string> bytes =
        entry["token_bytes"].is_string() ? base64_decode(entry["token_bytes"].get<std::string>()) : std::nullopt;
    MEGATRON_CHECK(bytes && !bytes->empty(), where << ": entry " << i << "'s token_bytes "
                                                   << entry["token_bytes"].dump() << " is not non-empty base64");
    MEGATRON_CHECK(i >= 256 || (bytes->size() == 1 && static_cast<uint8_t>((*bytes)[0]) == i),
                   where << ": entry " << i << " must be the single byte " << i
                         << " (the 256 byte tokens come first, in byte order)");
    tokens.push_back(*bytes);
  }
  return tokens;
}

// Megatron's special tokens: `given` (which must hold its seven), then fillers up to `count`.
std::vector<std::string> special_tokens_of(const TikTokenizerOptions& o) {
  std::set<std::string> seen;
  for (const std::string& t : o.special_tokens)
    MEGATRON_CHECK(!t.empty() && seen.insert(t).second,
                   "TikTokenizer --special-tokens: '" << t << "' is empty or given twice");
  for (const std::string& t : kTikTokenSpecialTokens)
    MEGATRON_CHECK(seen.count(t), "TikTokenizer --special-tokens must include Megatron's <unk> <s> </s> <mask> <pad> "
                                  "<cls> <sep>; "
                                      << t << " is missing");
  MEGATRON_CHECK(int64_t(o.special_tokens.size()) <= o.num_special_tokens && o.num_special_tokens < o.vocab_size,
                 "TikTokenizer: " << o.special_tokens.size() << " special tokens, --tiktoken-num-special-tokens "
                                  << o.num_special_tokens << " and --vocab-size " << o.vocab_size
                                  << " must satisfy special tokens <= num special tokens < vocab size");
  std::vector<std::string> all = o.special_tokens;
  for (int64_t k = int64_t(all.size()); k < o.num_special_tokens; ++k) {
    all.push_back("<SPECIAL_" + std::to_string(k) + ">");
    MEGATRON_CHECK(seen.insert(all.back()).second,
                   "TikTokenizer --special-tokens: " << all.back() << " is also the name of filler " << k);
  }
  return all;
}

int32_t index_of(const std::vector<std::string>& tokens, const std::string& token) {
  return int32_t(std::find(tokens.begin(), tokens.end(), token) - tokens.begin());
}

}  // namespace

TikTokenizer::TikTokenizer(const std::string& path, const TikTokenizerOptions& options)
    : path_(path),
      specials_(special_tokens_of(options)),
      vocab_size_(options.vocab_size),
      bos_(index_of(specials_, "<s>")),
      eos_(index_of(specials_, "</s>")),
      bpe_(BytePairEncoder::from_ranks(load_ranks(path, options.vocab_size - options.num_special_tokens),
                                       int32_t(options.num_special_tokens), "TikTokenizer --tokenizer-model " + path)),
      splitter_(split_pattern(options.pattern), SplitBehavior::isolated, false) {
  for (size_t id = 0; id < specials_.size(); ++id)
    specials_by_first_byte_[static_cast<uint8_t>(specials_[id].at(0))].push_back(int32_t(id));
}

void TikTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::string_view> pieces;
  splitter_.split(text, pieces);
  for (std::string_view piece : pieces) bpe_.encode_word(piece, ids);
}

std::vector<int32_t> TikTokenizer::encode(std::string_view text) const {
  check_utf8(text, "TikTokenizer input");
  std::vector<int32_t> ids;
  size_t start = 0;  // the text not yet encoded begins here
  size_t at = 0;
  while (at < text.size()) {
    // tiktoken's special-token regex: the leftmost match (its alternatives' order is a hash set's,
    // so where one special token is a prefix of another the longest is taken here).
    int32_t found = -1;
    for (int32_t id : specials_by_first_byte_[static_cast<uint8_t>(text[at])])
      if (text.compare(at, specials_[size_t(id)].size(), specials_[size_t(id)]) == 0 &&
          (found < 0 || specials_[size_t(id)].size() > specials_[size_t(found)].size()))
        found = id;
    if (found < 0) {
      ++at;
      continue;
    }
    encode_ordinary(text.substr(start, at - start), ids);
    ids.push_back(found);
    at += specials_[size_t(found)].size();
    start = at;
  }
  encode_ordinary(text.substr(start), ids);
  return ids;
}

std::string TikTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id >= 0 && size_t(id) < specials_.size()) {
      text += specials_[size_t(id)];
      continue;
    }
    const std::optional<std::string_view> bytes = bpe_.token_bytes(id);
    MEGATRON_CHECK(bytes.has_value(), "TikTokenizer cannot decode id " << id << ": the vocabulary has ids [0, "
                                                                       << vocab_size_ << ")");
    text += *bytes;
  }
  return text;
}

std::vector<SpecialToken> TikTokenizer::special_tokens() const {
  std::vector<SpecialToken> out;
  for (size_t id = 0; id < specials_.size(); ++id) out.push_back({specials_[id], int32_t(id)});
  return out;
}

}  // namespace megatron::datasets
