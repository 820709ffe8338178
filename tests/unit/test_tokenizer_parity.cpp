// Token-id parity with independent JavaScript tokenizers run under node (the oracles in
// tests/tokenizer_oracle/, fetched with the fixtures by scripts/fetch-fixtures.sh) on a
// corpus of a few megabytes built here deterministically: English (fortunes), C++ (this
// repository's sources) and generated text in many scripts, emoji sequences, combining marks,
// whitespace runs, numbers, contractions and long words. Each document is encoded on its own,
// as preprocess-data does; ids must be identical and decode(encode(x)) must give x back.
//
// The corpus leaves out the few characters on which the oracles' regex engines disagree with
// the Hugging Face / tiktoken ones by design (JavaScript's \s takes U+FEFF but not U+0085; PCRE2
// has Unicode 14, node 20 Unicode 15), see pretokenize.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/datasets/tokenizers/gpt2_bpe_tokenizer.h"
#include "megatron/datasets/tokenizers/hf_tokenizer.h"
#include "megatron/datasets/tokenizers/tiktoken_tokenizer.h"
#include "test_tokenizer_fixtures.h"
#include "test_util.h"

using namespace megatron::datasets;
using megatron::testing::repo_root;
using megatron::testing::TempDir;
using megatron::testing::tokenizer_fixture;
namespace fs = std::filesystem;

namespace {

// splitmix64: a fixed, portable generator, so the corpus is the same everywhere.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return size_t(next() % n); }
  template <class T>
  const T& pick(const std::vector<T>& items) {
    return items[below(items.size())];
  }
};

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Words and fragments per script. Every string is valid UTF-8 of Unicode 14 or older.
const std::vector<std::vector<std::string>>& vocabularies() {
  static const std::vector<std::vector<std::string>> v = {
      // English with contractions (straight and curly apostrophes, upper case for (?i:'S))
      {"the",
       "The",
       "it's",
       "IT'S",
       "don't",
       "DON'T",
       "we're",
       "they've",
       "I'm",
       "you'll",
       "he'd",
       "o'clock",
       "rock'n'roll",
       "isn\xE2\x80\x99t",
       "Tokenization",
       "antidisestablishmentarianism",
       "well-known",
       "e.g.",
       "U.S.A.",
       "CamelCaseIdentifier",
       "snake_case_name",
       "HTTP/2",
       "x86_64"},
      // Chinese, Japanese (kana, kanji, half-width katakana), Korean
      {"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", "\xE4\xB8\xAD\xE6\x96\x87\xE5\x88\x86\xE8\xAF\x8D",
       "\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF",
       "\xE3\x82\xAB\xE3\x82\xBF\xE3\x82\xAB\xE3\x83\x8A", "\xEF\xBD\xB6\xEF\xBE\x80\xEF\xBD\xB6\xEF\xBE\x85",
       "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", "\xEC\x95\x88\xEB\x85\x95\xED\x95\x98\xEC\x84\xB8\xEC\x9A\x94",
       "\xE3\x80\x82", "\xEF\xBC\x8C", "\xE3\x80\x8C\xE5\xBC\x95\xE7\x94\xA8\xE3\x80\x8D"},
      // Cyrillic, Greek, Arabic (with harakat), Hebrew, Devanagari (with virama and matras), Thai
      {"\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82", "\xD0\xBC\xD0\xB8\xD1\x80",
       "\xD1\x97\xD0\xB6\xD0\xB0\xD0\xBA", "\xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC",
       "\xD8\xA7\xD9\x84\xD8\xB9\xD8\xB1\xD8\xA8\xD9\x8A\xD8\xA9",
       "\xD9\x85\xD9\x8E\xD8\xB1\xD9\x92\xD8\xAD\xD9\x8E\xD8\xA8\xD8\xA7\xD9\x8B", "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D",
       "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82\xE0\xA4\xA6\xE0\xA5\x80",
       "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",
       "\xE0\xB8\xAA\xE0\xB8\xA7\xE0\xB8\xB1\xE0\xB8\xAA\xE0\xB8\x94\xE0\xB8\xB5"},
      // Emoji: plain, skin tones, ZWJ families and professions, flags, keycaps, variation selectors
      {"\xF0\x9F\xA4\x97", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
       "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7\xE2\x80\x8D\xF0\x9F\x91\xA6",
       "\xF0\x9F\x91\xA9\xF0\x9F\x8F\xBF\xE2\x80\x8D\xF0\x9F\x92\xBB", "\xF0\x9F\x87\xAF\xF0\x9F\x87\xB5",
       "\xF0\x9F\x87\xBA\xF0\x9F\x87\xA6", "1\xEF\xB8\x8F\xE2\x83\xA3", "\xE2\x9D\xA4\xEF\xB8\x8F",
       "\xF0\x9F\x8F\xB3\xEF\xB8\x8F\xE2\x80\x8D\xF0\x9F\x8C\x88", "\xE2\x98\x83"},
      // Combining marks: decomposed accents, stacked marks, marks after digits and spaces
      {"e\xCC\x81", "n\xCC\x83o", "a\xCC\x8A\xCC\x81", "Z\xCD\x91\xCD\x97\xCC\x88\xCC\x83", "5\xCC\x81", " \xCC\x81",
       "\xE1\xBA\xBF", "Vi\xE1\xBB\x87t",
       "stra\xC3\x9F"
       "e",
       "\xC3\x85ngstr\xC3\xB6m"},
      // Numbers: long runs, separators, other digit sets (Arabic-Indic, Devanagari, fullwidth),
      // No and Nl (superscripts, fractions, Roman numerals)
      {"0", "42", "3.14159", "1,000,000", "2024-06-01", "123456789012345678901234567890", "0x1F600", "1e-9",
       "\xD9\xA0\xD9\xA1\xD9\xA2\xD9\xA3", "\xE0\xA5\xA7\xE0\xA5\xA8\xE0\xA5\xA9",
       "\xEF\xBC\x91\xEF\xBC\x92\xEF\xBC\x93", "x\xC2\xB2", "\xC2\xBD", "\xE2\x85\xAB", "\xE2\x91\xA0"},
      // Punctuation, symbols, special-token look-alikes and real special tokens as text
      {"...",
       "!!!",
       "?!",
       "--->",
       "=>",
       "::",
       "{}",
       "[]",
       "()",
       "<|endoftext|>",
       "<|begin_of_text|>",
       "<|end_of_text|>",
       "<|eot_id|>",
       "<|unknown|>",
       "<|",
       "|>",
       "\xE2\x80\x94",
       "\xC2\xAB\xC2\xBB",
       "\xE2\x82\xAC",
       "\xC2\xA9",
       "\xE2\x88\x91",
       "@user",
       "#tag",
       "$HOME",
       "%d",
       "&amp;",
       "\\n",
       "'",
       "\"",
       "`"},
  };
  return v;
}

// Separators: single and runs of spaces, tabs, newlines, CRLF and Unicode spaces (NBSP,
// em space, ideographic space, line separator).
const std::vector<std::string>& separators() {
  static const std::vector<std::string> s = {
      " ",   " ",    " ",      " ",        "  ",       "   ",          "\t",           "\n",           "\n\n",
      " \n", "\r\n", "\n\t\t", "        ", "\xC2\xA0", "\xE2\x80\x83", "\xE3\x80\x80", "\xE2\x80\xA8", " \t \n ",
      ""};
  return s;
}

std::string long_word(Rng& rng) {
  static const std::string alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/";
  std::string w;
  const size_t length = 65 + rng.below(400);  // past the short-word scan
  for (size_t k = 0; k < length; ++k) w += alphabet[rng.below(rng.below(2) ? 26 : alphabet.size())];
  return w;
}

std::string generated_document(Rng& rng) {
  std::string doc;
  const size_t words = 20 + rng.below(300);
  const auto& vocabs = vocabularies();
  const std::vector<std::string>& main_vocab = vocabs[rng.below(vocabs.size())];
  for (size_t k = 0; k < words; ++k) {
    const bool other = rng.below(4) == 0;
    if (rng.below(60) == 0) {
      doc += long_word(rng);
    } else if (rng.below(40) == 0) {
      doc += std::string(1 + rng.below(70), " \t\n"[rng.below(3)]);
    } else {
      doc += rng.pick(other ? vocabs[rng.below(vocabs.size())] : main_vocab);
    }
    doc += rng.pick(separators());
  }
  return doc;
}

// The corpus: about 1.2 MB of fortunes, 0.8 MB of sources, 1 MB generated.
const std::vector<std::string>& corpus() {
  static const std::vector<std::string> documents = [] {
    std::vector<std::string> docs;
    size_t english = 0;
    const fs::path fortunes = "/usr/share/games/fortunes";
    if (fs::is_directory(fortunes)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(fortunes)) {
        const std::string ext = e.path().extension().string();
        if (e.is_regular_file() && !e.is_symlink() && ext != ".dat" && ext != ".u8") files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      for (const fs::path& file : files) {
        std::string text = read_all(file);
        for (size_t begin = 0; begin < text.size() && english < 1200000;) {
          size_t end = text.find("\n%\n", begin);
          if (end == std::string::npos) end = text.size();
          std::string doc = text.substr(begin, end - begin);
          begin = end + 3;
          english += doc.size();
          docs.push_back(std::move(doc));
        }
      }
    }
    std::vector<fs::path> sources;
    for (const auto& e : fs::recursive_directory_iterator(repo_root() / "src" / "megatron")) {
      if (e.is_regular_file()) sources.push_back(e.path());
    }
    std::sort(sources.begin(), sources.end());
    size_t code = 0;
    for (const fs::path& file : sources) {
      if (code > 800000) break;
      docs.push_back(read_all(file));
      code += docs.back().size();
    }
    Rng rng{20240601};
    for (size_t generated = 0; generated < 1000000;) {
      docs.push_back(generated_document(rng));
      generated += docs.back().size();
    }
    return docs;
  }();
  return documents;
}

// Runs one oracle script over `documents`; one vector of ids per document.
std::vector<std::vector<int32_t>> oracle_ids(const std::string& script, const std::vector<std::string>& documents) {
  const TempDir dir;
  std::ofstream(dir / "documents.json", std::ios::binary) << nlohmann::json(documents).dump();
  const std::string fixtures = fs::path(tokenizer_fixture("node_modules")).parent_path().string();
  const std::string command = "node '" + (repo_root() / "tests" / "tokenizer_oracle" / script).string() + "' '" +
                              fixtures + "' '" + dir / "documents.json" + "' '" + dir / "ids.txt" + "'";
  const int status = std::system(command.c_str());
  if (status != 0) {
    throw std::runtime_error("oracle failed (status " + std::to_string(status) + "): " + command +
                             "\nis node installed? run scripts/setup.sh and scripts/fetch-fixtures.sh");
  }
  std::ifstream in(dir / "ids.txt");
  std::vector<std::vector<int32_t>> ids;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    ids.emplace_back();
    for (int32_t id; words >> id;) ids.back().push_back(id);
  }
  if (ids.size() != documents.size()) {
    throw std::runtime_error(script + " wrote " + std::to_string(ids.size()) + " lines for " +
                             std::to_string(documents.size()) + " documents");
  }
  return ids;
}

std::string show(const std::vector<int32_t>& ids, size_t from) {
  std::string s;
  for (size_t k = from; k < std::min(ids.size(), from + 12); ++k) s += std::to_string(ids[k]) + " ";
  return s;
}

// Encodes every document, compares with the oracle and checks the round trip; reports the
// first few differing documents with where they differ.
void expect_parity(const Tokenizer& tokenizer, const std::string& script, const std::vector<std::string>& documents) {
  const std::vector<std::vector<int32_t>> expected = oracle_ids(script, documents);
  size_t mismatches = 0, tokens = 0, bytes = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    const std::vector<int32_t> ids = tokenizer.encode(documents[d]);
    tokens += ids.size();
    bytes += documents[d].size();
    if (ids != expected[d] && ++mismatches <= 3) {
      const size_t at =
          size_t(std::mismatch(ids.begin(), ids.end(), expected[d].begin(), expected[d].end()).first - ids.begin());
      const size_t from = at < 3 ? 0 : at - 3;
      ADD_FAILURE() << script << ": document " << d << " differs at id " << at << "\n  ours:   " << show(ids, from)
                    << "\n  oracle: " << show(expected[d], from) << "\n  text near there: "
                    << tokenizer.decode(std::vector<int32_t>(ids.begin() + long(from),
                                                             ids.begin() + long(std::min(ids.size(), at + 3))));
    }
    EXPECT_EQ(tokenizer.decode(ids), documents[d]) << "round trip of document " << d;
  }
  EXPECT_EQ(mismatches, 0u) << "of " << documents.size() << " documents";
  std::cout << script << ": " << documents.size() << " documents, " << bytes << " bytes, " << tokens
            << " tokens compared\n";
}

}  // namespace

TEST(TokenizerParity, CorpusIsLargeAndVaried) {
  size_t bytes = 0;
  for (const std::string& doc : corpus()) bytes += doc.size();
  EXPECT_GT(bytes, 1900000u);  // at least the sources and generated parts, more with fortunes
  EXPECT_GT(corpus().size(), 500u);
}

TEST(TokenizerParity, Gpt2MatchesTiktoken) {
  const GPT2BPETokenizer tokenizer(tokenizer_fixture("gpt2/vocab.json"), tokenizer_fixture("gpt2/merges.txt"));
  expect_parity(tokenizer, "gpt2_tiktoken.js", corpus());
}

// gpt-3-encoder concatenates arrays quadratically, so it sees every 8th document only.
TEST(TokenizerParity, Gpt2MatchesGpt3Encoder) {
  const GPT2BPETokenizer tokenizer(tokenizer_fixture("gpt2/vocab.json"), tokenizer_fixture("gpt2/merges.txt"));
  std::vector<std::string> sample;
  for (size_t d = 0; d < corpus().size(); d += 8) sample.push_back(corpus()[d]);
  expect_parity(tokenizer, "gpt2_gpt3_encoder.js", sample);
}

TEST(TokenizerParity, Llama3MatchesTransformersJs) {
  const HuggingFaceTokenizer tokenizer(tokenizer_fixture("llama3/tokenizer.json"));
  expect_parity(tokenizer, "llama3_transformers_js.js", corpus());
}

// Megatron's TikTokenizer on a vocabulary of cl100k_base's tokens in Megatron's layout (the bytes
// first; tests/tokenizer_oracle/megatron_tiktoken_vocab.js), against the npm tiktoken package's
// Rust core built as Megatron builds it (megatron_tiktoken.js): 1000 special tokens, the v2
// pattern, special tokens' text encoded as their ids.
TEST(TokenizerParity, TikTokenizerMatchesTiktoken) {
  const TempDir dir;
  const std::string vocab = dir / "vocab.json";
  const std::string fixtures = fs::path(tokenizer_fixture("node_modules")).parent_path().string();
  const std::string command = "node '" +
                              (repo_root() / "tests" / "tokenizer_oracle" / "megatron_tiktoken_vocab.js").string() +
                              "' '" + fixtures + "' '" + vocab + "'";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const int64_t vocab_size = 1000 + 100256;  // every cl100k token
  setenv("MEGATRON_TIKTOKEN_VOCAB", vocab.c_str(), 1);
  setenv("MEGATRON_TIKTOKEN_VOCAB_SIZE", std::to_string(vocab_size).c_str(), 1);
  const TikTokenizer tokenizer(vocab, {.vocab_size = vocab_size});
  std::vector<std::string> documents = corpus();
  documents.push_back("special <s>tokens</s> in <pad> the <SPECIAL_999> text, and not: <s <SPECIAL_1000>");
  expect_parity(tokenizer, "megatron_tiktoken.js", documents);
}
