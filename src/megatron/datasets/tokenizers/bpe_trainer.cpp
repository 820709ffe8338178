#include "megatron/datasets/tokenizers/bpe_trainer.h"

#include <algorithm>
#include <array>
#include <exception>
#include <nlohmann/json.hpp>
#include <queue>
#include <thread>

#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/pretokenize.h"

namespace megatron::datasets {

namespace {

uint64_t pair_key(int32_t left, int32_t right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }

struct PairStats {
  int64_t count = 0;
  std::vector<uint32_t> words;  // words that held the pair when it was counted; may hold stale entries
};

// Heap entry: the count a pair had when pushed. Highest count first, then the smallest pair.
struct Candidate {
  int64_t count;
  int32_t left, right;
  bool operator<(const Candidate& o) const {
    if (count != o.count) return count < o.count;
    return std::pair(left, right) > std::pair(o.left, o.right);
  }
};

}  // namespace

WordCounts count_words(const std::vector<std::string_view>& documents, int threads) {
  threads = std::max(1, std::min<int>(threads, int(documents.size())));
  const RegexSplitter splitter(kGpt2SplitPattern, SplitBehavior::isolated, false);
  std::vector<WordCounts> partial(static_cast<size_t>(threads));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        std::vector<std::string_view> words;
        WordCounts& counts = partial[size_t(t)];
        // Contiguous shares: thread t takes documents [begin, end).
        const size_t begin = documents.size() * size_t(t) / size_t(threads);
        const size_t end = documents.size() * size_t(t + 1) / size_t(threads);
        for (size_t d = begin; d < end; ++d) {
          check_utf8(documents[d], "document " + std::to_string(d));
          words.clear();
          splitter.split(documents[d], words);
          for (std::string_view w : words) {
            const auto it = counts.find(w);
            if (it != counts.end()) {
              ++it->second;
            } else {
              counts.emplace(std::string(w), 1);
            }
          }
        }
      } catch (...) {
        errors[size_t(t)] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  WordCounts total = std::move(partial[0]);
  for (size_t t = 1; t < partial.size(); ++t) {
    for (auto& [word, count] : partial[t]) total[word] += count;
  }
  return total;
}

BpeModel train_bpe(const WordCounts& counts, const BpeTrainOptions& options) {
  MEGATRON_CHECK(options.vocab_size >= 257, "--vocab-size " << options.vocab_size
                                                            << " is too small: a byte-level BPE needs the 256 byte "
                                                            << "tokens and <|endoftext|>, so at least 257");
  MEGATRON_CHECK(options.vocab_size - 1 <= INT32_MAX, "--vocab-size " << options.vocab_size << " exceeds 2^31");
  BpeModel model;
  std::array<int32_t, 256> byte_token{};
  {
    // Order the bytes by their stand-in code point: GPT-2's layout of ids 0-255.
    std::vector<int> order(256);
    for (int b = 0; b < 256; ++b) order[size_t(b)] = b;
    std::sort(order.begin(), order.end(), [](int a, int b) {
      const bool sa = byte_to_unicode(uint8_t(a)) == char32_t(a), sb = byte_to_unicode(uint8_t(b)) == char32_t(b);
      return sa != sb ? sa : byte_to_unicode(uint8_t(a)) < byte_to_unicode(uint8_t(b));
    });
    for (int id = 0; id < 256; ++id) {
      byte_token[size_t(order[size_t(id)])] = id;
      model.tokens.emplace_back(1, static_cast<char>(order[size_t(id)]));
    }
  }
  // Words in a fixed order (by bytes), so the word lists, and hence nothing else, depend on
  // the hash map's iteration order.
  std::vector<std::pair<std::string_view, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> freq(sorted.size());
  std::unordered_map<uint64_t, PairStats> pairs;
  for (size_t w = 0; w < sorted.size(); ++w) {
    freq[w] = sorted[w].second;
    for (char c : sorted[w].first) words[w].push_back(byte_token[static_cast<uint8_t>(c)]);
    for (size_t k = 0; k + 1 < words[w].size(); ++k) {
      PairStats& stats = pairs[pair_key(words[w][k], words[w][k + 1])];
      stats.count += freq[w];
      if (stats.words.empty() || stats.words.back() != w) stats.words.push_back(uint32_t(w));
    }
  }
  std::priority_queue<Candidate> heap;
  for (const auto& [key, stats] : pairs) heap.push({stats.count, int32_t(key >> 32), int32_t(key & 0xFFFFFFFF)});

  const int64_t wanted = options.vocab_size - 1 - 256;
  std::vector<uint64_t> touched;
  while (int64_t(model.merges.size()) < wanted && !heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    const uint64_t key = pair_key(top.left, top.right);
    PairStats& best = pairs[key];
    if (best.count != top.count) {  // stale: the count fell since this entry was pushed
      if (best.count > 0) heap.push({best.count, top.left, top.right});
      continue;
    }
    if (best.count < options.min_frequency) break;
    const auto merged = int32_t(model.tokens.size());
    model.tokens.push_back(model.tokens[size_t(top.left)] + model.tokens[size_t(top.right)]);
    model.merges.emplace_back(top.left, top.right);
    touched.clear();
    const std::vector<uint32_t> holders = std::move(best.words);
    for (uint32_t w : holders) {
      std::vector<int32_t>& symbols = words[w];
      const auto holds = [&](size_t k) { return symbols[k] == top.left && symbols[k + 1] == top.right; };
      bool found = false;
      for (size_t k = 0; k + 1 < symbols.size() && !found; ++k) found = holds(k);
      if (!found) continue;
      // Take the word's pairs out, merge left to right without overlap, put them back.
      for (size_t k = 0; k + 1 < symbols.size(); ++k) pairs[pair_key(symbols[k], symbols[k + 1])].count -= freq[w];
      std::vector<int32_t> next;
      next.reserve(symbols.size());
      for (size_t k = 0; k < symbols.size(); ++k) {
        if (k + 1 < symbols.size() && holds(k)) {
          next.push_back(merged);
          ++k;
        } else {
          next.push_back(symbols[k]);
        }
      }
      symbols = std::move(next);
      for (size_t k = 0; k + 1 < symbols.size(); ++k) {
        const uint64_t p = pair_key(symbols[k], symbols[k + 1]);
        PairStats& stats = pairs[p];
        stats.count += freq[w];
        if (symbols[k] == merged || symbols[k + 1] == merged) {
          if (stats.words.empty() || stats.words.back() != w) stats.words.push_back(w);
          touched.push_back(p);
        }
      }
    }
    // Only pairs holding the new token gained counts; the others fell and are fixed lazily.
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t p : touched) heap.push({pairs[p].count, int32_t(p >> 32), int32_t(p & 0xFFFFFFFF)});
    pairs.erase(key);
    if (options.progress && model.merges.size() % 1000 == 0) options.progress(int64_t(model.merges.size()), wanted);
  }
  if (options.progress) options.progress(int64_t(model.merges.size()), wanted);
  return model;
}

std::string bpe_tokenizer_json(const BpeModel& model) {
  using Json = nlohmann::ordered_json;
  Json vocab = Json::object();
  for (size_t id = 0; id < model.tokens.size(); ++id) vocab[bytes_to_unicode_string(model.tokens[id])] = id;
  Json merges = Json::array();
  for (const auto& [left, right] : model.merges) {
    merges.push_back(Json::array(
        {bytes_to_unicode_string(model.tokens[size_t(left)]), bytes_to_unicode_string(model.tokens[size_t(right)])}));
  }
  const Json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const Json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", Json::array({{{"id", model.tokens.size()},
                                     {"content", "<|endoftext|>"},
                                     {"single_word", false},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"normalized", false},
                                     {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
  return root.dump(1) + "\n";
}

}  // namespace megatron::datasets
