#include "megatron/datasets/tokenizers/bpe.h"

#include <algorithm>
#include <atomic>

#include "megatron/core/error.h"

namespace megatron::datasets {

namespace {

// Bytes GPT-2 keeps as their own code point: printable Latin-1 without space and soft hyphen.
bool is_self_mapped(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

struct StandInTables {
  std::array<char32_t, 256> to_unicode{};
  std::array<int16_t, 0x144> to_byte{};  // stand-ins are all below U+0144; -1: not a stand-in
  StandInTables() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      to_unicode[b] = is_self_mapped(b) ? char32_t(b) : char32_t(0x100 + n++);
      to_byte[to_unicode[b]] = int16_t(b);
    }
  }
};

const StandInTables& stand_ins() {
  static const StandInTables tables;
  return tables;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else {  // stand-ins never need 4 bytes; callers pass only code points below U+10000
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

std::string hex_byte(uint8_t b) {
  const char* digits = "0123456789ABCDEF";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

// Per-thread memo of encoded words. Entries are keyed by encoder (cache_key_), so encoders
// never see each other's results; a few slots let one thread alternate between encoders.
struct WordCache {
  uint64_t key = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> index;  // offset, count
  std::vector<int32_t> ids;
  void reset(uint64_t new_key) {
    key = new_key;
    index.clear();
    ids.clear();
  }
};
constexpr size_t kCacheSlots = 4;
constexpr size_t kMaxCachedWordBytes = 64;     // longer words rarely repeat
constexpr size_t kMaxCacheEntries = 1u << 19;  // then start afresh: bounds memory per thread

WordCache& thread_cache(uint64_t key) {
  thread_local std::array<WordCache, kCacheSlots> slots;
  thread_local size_t next_victim = 0;
  for (WordCache& slot : slots) {
    if (slot.key == key) return slot;
  }
  WordCache& slot = slots[next_victim];
  next_victim = (next_victim + 1) % kCacheSlots;
  slot.reset(key);
  return slot;
}

std::atomic<uint64_t> next_cache_key{1};

constexpr size_t kShortWord = 64;  // rank scan up to here, heap beyond

}  // namespace

char32_t byte_to_unicode(uint8_t b) { return stand_ins().to_unicode[b]; }

std::string bytes_to_unicode_string(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) append_utf8(byte_to_unicode(static_cast<uint8_t>(b)), out);
  return out;
}

std::optional<std::string> unicode_string_to_bytes(std::string_view token) {
  const StandInTables& t = stand_ins();
  std::string out;
  out.reserve(token.size());
  size_t k = 0;
  while (k < token.size()) {
    const auto b0 = static_cast<uint8_t>(token[k]);
    char32_t c = 0;
    if (b0 < 0x80) {
      c = b0, k += 1;
    } else if ((b0 & 0xE0) == 0xC0 && k + 1 < token.size()) {  // stand-ins need at most 2 bytes
      c = char32_t(b0 & 0x1F) << 6 | (static_cast<uint8_t>(token[k + 1]) & 0x3F), k += 2;
    } else {
      return std::nullopt;
    }
    if (c >= t.to_byte.size() || t.to_byte[c] < 0) return std::nullopt;
    out += static_cast<char>(t.to_byte[c]);
  }
  return out;
}

// Open addressing with linear probing over (left id, right id) keys: the merge loop's only
// look-up, so it avoids std::unordered_map's node chasing.
struct BytePairEncoder::PairTable {
  struct Slot {
    uint64_t key = kEmpty;
    Lookup value{kNoRank, -1};
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);  // ids are non-negative int32: never a key
  std::vector<Slot> slots;
  uint64_t mask = 0;

  explicit PairTable(size_t entries) {
    size_t capacity = 16;
    while (capacity < entries * 2) capacity *= 2;
    slots.resize(capacity);
    mask = capacity - 1;
  }
  static uint64_t key_of(int32_t left, int32_t right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }
  size_t home(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask; }
  void put(uint64_t key, Lookup value) {
    for (size_t k = home(key);; k = (k + 1) & mask) {
      if (slots[k].key == kEmpty || slots[k].key == key) {
        slots[k] = {key, value};
        return;
      }
    }
  }
  Lookup get(uint64_t key) const {
    for (size_t k = home(key);; k = (k + 1) & mask) {
      if (slots[k].key == key) return slots[k].value;
      if (slots[k].key == kEmpty) return {kNoRank, -1};
    }
  }
};

BytePairEncoder::BytePairEncoder(const std::vector<std::pair<std::string, int32_t>>& vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                                 std::string source)
    : BytePairEncoder(vocab, merges.size(), std::move(source)) {
  ignore_merges_ = ignore_merges;
  std::unordered_map<std::string_view, int32_t> by_stand_in;  // views into `vocab`
  by_stand_in.reserve(vocab.size());
  for (const auto& [token, id] : vocab) by_stand_in.emplace(token, id);
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto l = by_stand_in.find(left);
    const auto r = by_stand_in.find(right);
    joined = left + right;
    const auto m = by_stand_in.find(joined);
    MEGATRON_CHECK(l != by_stand_in.end() && r != by_stand_in.end() && m != by_stand_in.end(),
                   source_ << ": merge " << rank << " '" << left << " " << right << "' uses a token missing from "
                           << "the vocabulary ('"
                           << (l == by_stand_in.end()   ? left
                               : r == by_stand_in.end() ? right
                                                        : joined)
                           << "'); the merges do not belong to this vocabulary");
    pairs_->put(PairTable::key_of(l->second, r->second), {int32_t(rank), m->second});
  }
}

BytePairEncoder BytePairEncoder::from_ranks(const std::vector<std::string>& tokens, int32_t id_offset,
                                            std::string source) {
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(tokens.size());
  size_t pairs = 0;
  for (size_t rank = 0; rank < tokens.size(); ++rank) {
    vocab.emplace_back(bytes_to_unicode_string(tokens[rank]), int32_t(rank) + id_offset);
    pairs += tokens[rank].empty() ? 0 : tokens[rank].size() - 1;
  }
  BytePairEncoder bpe(vocab, pairs, std::move(source));
  for (size_t rank = 0; rank < tokens.size(); ++rank) {
    const std::string_view token = tokens[rank];
    for (size_t split = 1; split < token.size(); ++split) {
      const std::optional<int32_t> left = bpe.token_id(token.substr(0, split)),
                                   right = bpe.token_id(token.substr(split));
      if (left && right) bpe.pairs_->put(PairTable::key_of(*left, *right), {int32_t(rank), int32_t(rank) + id_offset});
    }
  }
  return bpe;
}

BytePairEncoder::BytePairEncoder(const std::vector<std::pair<std::string, int32_t>>& vocab, size_t pairs,
                                 std::string source)
    : source_(std::move(source)),
      pairs_(std::make_unique<PairTable>(pairs)),
      ignore_merges_(false),
      cache_key_(next_cache_key.fetch_add(1)) {
  byte_ids_.fill(-1);
  std::unordered_map<std::string_view, int32_t> by_stand_in;  // views into `vocab`
  by_stand_in.reserve(vocab.size());
  for (const auto& [token, id] : vocab) {
    MEGATRON_CHECK(id >= 0,
                   source_ << ": token '" << token << "' has negative id " << id << "; ids must be non-negative");
    max_id_ = std::max(max_id_, id);
    const bool fresh = by_stand_in.emplace(token, id).second;
    MEGATRON_CHECK(fresh, source_ << ": token '" << token << "' appears twice in the vocabulary");
  }
  id_bytes_.resize(size_t(max_id_ + 1));
  has_id_.assign(size_t(max_id_ + 1), false);
  for (const auto& [token, id] : vocab) {
    MEGATRON_CHECK(!has_id_[size_t(id)], source_ << ": id " << id << " is given to two tokens, '"
                                                 << id_bytes_[size_t(id)] << "' and '" << token
                                                 << "'; every id must name one token");
    has_id_[size_t(id)] = true;
    std::optional<std::string> bytes = unicode_string_to_bytes(token);
    if (!bytes) {  // not byte-level: reachable only as an added token, decodes as itself
      id_bytes_[size_t(id)] = token;
      continue;
    }
    if (bytes->size() == 1) byte_ids_[static_cast<uint8_t>((*bytes)[0])] = id;
    bytes_to_id_.emplace(*bytes, id);
    id_bytes_[size_t(id)] = std::move(*bytes);
  }
  size_ = int64_t(vocab.size());
}

BytePairEncoder::BytePairEncoder(BytePairEncoder&&) noexcept = default;
BytePairEncoder::~BytePairEncoder() = default;

BytePairEncoder::Lookup BytePairEncoder::lookup(int32_t left, int32_t right) const {
  return pairs_->get(PairTable::key_of(left, right));
}

int32_t BytePairEncoder::byte_id(uint8_t b) const {
  const int32_t id = byte_ids_[b];
  MEGATRON_CHECK(id >= 0, source_ << ": byte " << hex_byte(b) << " has no token in the vocabulary, so text "
                                  << "containing it cannot be encoded; a byte-level vocabulary needs all 256 "
                                  << "byte tokens");
  return id;
}

std::optional<std::string_view> BytePairEncoder::token_bytes(int32_t id) const {
  if (id < 0 || id > max_id_ || !has_id_[size_t(id)]) return std::nullopt;
  return std::string_view(id_bytes_[size_t(id)]);
}

std::optional<int32_t> BytePairEncoder::token_id(std::string_view bytes) const {
  const auto it = bytes_to_id_.find(bytes);
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

void BytePairEncoder::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    out.push_back(byte_id(static_cast<uint8_t>(word[0])));
    return;
  }
  WordCache* cache = nullptr;
  if (word.size() <= kMaxCachedWordBytes) {
    cache = &thread_cache(cache_key_);
    const auto hit = cache->index.find(word);
    if (hit != cache->index.end()) {
      const auto [offset, count] = hit->second;
      out.insert(out.end(), cache->ids.begin() + offset, cache->ids.begin() + offset + count);
      return;
    }
  }
  const size_t first = out.size();
  std::optional<int32_t> whole;
  if (ignore_merges_) whole = token_id(word);
  if (whole) {
    out.push_back(*whole);
  } else if (word.size() <= kShortWord) {
    merge_short(word, out);
  } else {
    merge_long(word, out);
  }
  if (cache != nullptr) {
    if (cache->index.size() >= kMaxCacheEntries) cache->reset(cache_key_);
    cache->index.emplace(std::string(word),
                         std::pair<uint32_t, uint32_t>(uint32_t(cache->ids.size()), uint32_t(out.size() - first)));
    cache->ids.insert(cache->ids.end(), out.begin() + first, out.end());
  }
}

// Rank scan on fixed arrays: no allocation, and for a handful of symbols faster than a heap.
void BytePairEncoder::merge_short(std::string_view word, std::vector<int32_t>& out) const {
  int32_t sym[kShortWord];
  Lookup pair[kShortWord];  // pair[k]: sym[k] with sym[k + 1]
  size_t n = word.size();
  for (size_t k = 0; k < n; ++k) sym[k] = byte_id(static_cast<uint8_t>(word[k]));
  for (size_t k = 0; k + 1 < n; ++k) pair[k] = lookup(sym[k], sym[k + 1]);
  while (n > 1) {
    size_t best = 0;
    for (size_t k = 1; k + 1 < n; ++k) {
      if (pair[k].rank < pair[best].rank) best = k;  // strict: the leftmost of equal ranks wins
    }
    if (pair[best].rank == kNoRank) break;
    sym[best] = pair[best].merged;
    for (size_t k = best + 1; k + 1 < n; ++k) {
      sym[k] = sym[k + 1];
      pair[k] = pair[k + 1];
    }
    --n;
    if (best > 0) pair[best - 1] = lookup(sym[best - 1], sym[best]);
    if (best + 1 < n) pair[best] = lookup(sym[best], sym[best + 1]);
  }
  out.insert(out.end(), sym, sym + n);
}

// A heap of candidate merges over a doubly linked list of symbols. Entries go stale when a
// neighbour merges; they are recognised on pop (dead node, other neighbour, other ids).
void BytePairEncoder::merge_long(std::string_view word, std::vector<int32_t>& out) const {
  struct Node {
    int32_t id, prev, next;
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, right, left_id, right_id, merged;
  };
  // Min-heap on (rank, pos): the lowest rank, then the leftmost, as tokenizers does.
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  thread_local std::vector<Node> nodes;
  thread_local std::vector<Candidate> heap;
  const auto n = int32_t(word.size());
  nodes.resize(size_t(n));
  heap.clear();
  for (int32_t k = 0; k < n; ++k)
    nodes[size_t(k)] = {byte_id(static_cast<uint8_t>(word[size_t(k)])), k - 1, k + 1, true};
  nodes[size_t(n - 1)].next = -1;
  const auto push = [&](int32_t pos) {
    const int32_t right = nodes[size_t(pos)].next;
    if (right < 0) return;
    const Lookup l = lookup(nodes[size_t(pos)].id, nodes[size_t(right)].id);
    if (l.rank == kNoRank) return;
    heap.push_back({l.rank, pos, right, nodes[size_t(pos)].id, nodes[size_t(right)].id, l.merged});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Node& left = nodes[size_t(c.pos)];
    if (!left.alive || left.next != c.right || left.id != c.left_id || nodes[size_t(c.right)].id != c.right_id) {
      continue;
    }
    Node& right = nodes[size_t(c.right)];
    left.id = c.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) nodes[size_t(right.next)].prev = c.pos;
    if (left.prev >= 0) push(left.prev);
    push(c.pos);
  }
  for (int32_t k = 0; k >= 0; k = nodes[size_t(k)].next) out.push_back(nodes[size_t(k)].id);
}

}  // namespace megatron::datasets
