#pragma once
// The byte-level BPE core shared by GPT2BPETokenizer, HuggingFaceTokenizer and the trainer
// (interop-formats.md 5.2, 5.3, 5.5).
//
// Vocabulary files write tokens in GPT-2's "byte stand-in" alphabet: every byte is one printable
// code point (space -> U+0120 'Ġ'). BytePairEncoder converts them to raw bytes once at load, so
// encoding works on the UTF-8 bytes of a pre-token directly and never builds stand-in strings.
//
// Merging follows Hugging Face tokenizers: repeatedly merge the adjacent pair of lowest rank,
// the leftmost one among equal ranks, until no pair has a rank. Short words use a rank scan
// over a small array, long ones a heap over a linked list (O(n log n), so a megabyte of spaces
// is not quadratic). Encoded words are cached per thread (see encode_word).
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace megatron::datasets {

// The stand-in code point of byte b (GPT-2's bytes_to_unicode table).
char32_t byte_to_unicode(uint8_t b);

// Raw bytes -> the UTF-8 of their stand-ins, as vocab.json, merges.txt and tokenizer.json write
// tokens.
std::string bytes_to_unicode_string(std::string_view bytes);

// The inverse: nullopt when some character is not one of the 256 stand-ins (or the text is
// not UTF-8), i.e. the token is not a byte-level token.
std::optional<std::string> unicode_string_to_bytes(std::string_view token);

// Transparent string hashing, so maps keyed by std::string take string_view look-ups.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BytePairEncoder {
 public:
  // vocab: tokens in stand-in form with their ids; merges: pairs of stand-in tokens, index =
  // rank (a repeated pair keeps its last rank, as tokenizers' and GPT-2's dicts do).
  // ignore_merges: a word that is itself in the vocabulary is emitted whole (LLaMA-3).
  // source names the files in error messages. Throws when a merge's parts or result are not
  // in the vocabulary, or ids repeat or are negative.
  BytePairEncoder(const std::vector<std::pair<std::string, int32_t>>& vocab,
                  const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                  std::string source);
  // tiktoken's form (Megatron's TikTokenizer): `tokens` (raw bytes) by rank, token k's id
  // k + id_offset. Adjacent parts merge when their concatenation is a token, at that token's rank
  // (every split of every token into two tokens is a pair), the leftmost of equal ranks first:
  // tiktoken's byte_pair_merge. Throws when a token repeats.
  static BytePairEncoder from_ranks(const std::vector<std::string>& tokens, int32_t id_offset, std::string source);
  BytePairEncoder(BytePairEncoder&&) noexcept;
  BytePairEncoder(const BytePairEncoder&) = delete;
  BytePairEncoder& operator=(const BytePairEncoder&) = delete;
  ~BytePairEncoder();

  // Appends the ids of one pre-token (any bytes). Throws when a byte has no token. Thread-safe:
  // results are memoised in a cache owned by the calling thread, which never changes them.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  // The bytes of token id, nullopt for ids outside the vocabulary. Tokens that are not
  // byte-level (some character is no stand-in) decode to their own UTF-8 text.
  std::optional<std::string_view> token_bytes(int32_t id) const;

  // The id of the byte-level token whose bytes are exactly `bytes`.
  std::optional<int32_t> token_id(std::string_view bytes) const;

  int64_t size() const { return size_; }      // number of vocabulary entries
  int32_t max_id() const { return max_id_; }  // -1 for an empty vocabulary

 private:
  struct PairTable;
  struct Lookup {
    int32_t rank;    // kNoRank when the pair does not merge
    int32_t merged;  // id of the merged token
  };
  static constexpr int32_t kNoRank = INT32_MAX;

  // The vocabulary alone (no pairs yet), room for `pairs` pairs.
  BytePairEncoder(const std::vector<std::pair<std::string, int32_t>>& vocab, size_t pairs, std::string source);
  Lookup lookup(int32_t left, int32_t right) const;
  int32_t byte_id(uint8_t b) const;
  void merge_short(std::string_view word, std::vector<int32_t>& out) const;
  void merge_long(std::string_view word, std::vector<int32_t>& out) const;

  std::string source_;
  std::vector<std::string> id_bytes_;  // by id; holes are empty and flagged in has_id_
  std::vector<bool> has_id_;
  TokenIdMap bytes_to_id_;             // byte-level tokens only
  std::array<int32_t, 256> byte_ids_;  // -1: the byte has no token
  std::unique_ptr<PairTable> pairs_;
  bool ignore_merges_;
  int64_t size_ = 0;
  int32_t max_id_ = -1;
  uint64_t cache_key_;  // distinguishes this encoder's entries in the per-thread caches
};

}  // namespace megatron::datasets
