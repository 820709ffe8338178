// HuggingFaceTokenizer: LLaMA-3's real tokenizer.json (interop-formats.md 7.3 known answers,
// the BOS template of Meta's file), GPT-2 as a tokenizer.json, and small handcrafted files for
// each component and each error.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/datasets/tokenizers/bpe.h"
#include "megatron/datasets/tokenizers/gpt2_bpe_tokenizer.h"
#include "megatron/datasets/tokenizers/hf_tokenizer.h"
#include "test_tokenizer_fixtures.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;
using megatron::testing::TempDir;
using megatron::testing::tokenizer_fixture;
using Json = nlohmann::json;

namespace {

const HuggingFaceTokenizer& llama3() {
  static const HuggingFaceTokenizer tokenizer(tokenizer_fixture("llama3/tokenizer.json"));
  return tokenizer;
}

Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

std::string write_json(const TempDir& dir, const Json& json, const std::string& name = "tokenizer.json") {
  std::ofstream(dir / name) << json.dump();
  return dir / name;
}

// A byte-level BPE with ids 0-255 = the bytes and merges he, ll, hell, hello, "Ġw"
// (ids 256-260), GPT-2's pipeline, and <|endoftext|> = 261 as special added token.
Json small_tokenizer() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes_to_unicode_string(std::string(1, char(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}};
  Json merge_list = Json::array();
  for (const auto& [l, r] : merges) {
    vocab[l + r] = int(vocab.size());
    merge_list.push_back(l + " " + r);
  }
  const Json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {{{"id", 261},
             {"content", "<|endoftext|>"},
             {"single_word", false},
             {"lstrip", false},
             {"rstrip", false},
             {"normalized", false},
             {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", vocab}, {"merges", merge_list}}}};
}

Json added(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

}  // namespace

TEST(HuggingFaceTokenizer, Llama3KnownAnswers) {
  const HuggingFaceTokenizer& tok = llama3();
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello world", {9906, 1917}},
      {"Hello world!", {9906, 1917, 0}},
      {"Hello, world!", {9906, 11, 1917, 0}},
      {" Hello world", {22691, 1917}},
      {"hello world", {15339, 1917}},
      {"The quick brown fox jumps over the lazy dog.", {791, 4062, 14198, 39935, 35308, 927, 279, 16053, 5679, 13}},
      {"12345678", {4513, 10961, 2495}},
      {"  leading spaces\n\nnewlines\ttab", {220, 6522, 12908, 271, 943, 8128, 59249}},
      {"I'm testing: 3.14, don't split weirdly!",
       {40, 2846, 7649, 25, 220, 18, 13, 975, 11, 1541, 956, 6859, 16682, 398, 0}},
      {"h\xC3\xA9llo w\xC3\xB6rld \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\xA4\x97",
       {71, 19010, 385, 289, 9603, 509, 105180, 102158, 11410, 97, 245}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok.encode(text), ids) << text;
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST(HuggingFaceTokenizer, Llama3SpecialTokensAndSizes) {
  const HuggingFaceTokenizer& tok = llama3();
  EXPECT_EQ(tok.vocab_size(), 128256);
  EXPECT_EQ(tok.eod(), 128001);  // eos_token of tokenizer_config.json: <|end_of_text|>
  EXPECT_EQ(tok.bos(), 128000);
  EXPECT_EQ(tok.special_tokens().size(), 256u);
  EXPECT_EQ(tok.encode("Hi<|eot_id|><|end_of_text|>x"), (std::vector<int32_t>{13347, 128009, 128001, 87}));
  EXPECT_EQ(tok.decode({13347, 128009}), "Hi<|eot_id|>");
  EXPECT_EQ(tok.encode("<|end_of_text|"), (std::vector<int32_t>{27, 91, 408, 3659, 4424, 91}));
  EXPECT_NE(error_of([] { llama3().encode("\xF0\x9F\xA4"); }).find("not valid UTF-8: byte 0xF0 at offset 0"),
            std::string::npos);
}

// Meta's published file wraps the post-processor as Sequence[ByteLevel, TemplateProcessing].
TEST(HuggingFaceTokenizer, Llama3BosTemplate) {
  const TempDir dir;
  Json json = read_json(tokenizer_fixture("llama3/tokenizer.json"));
  json["post_processor"] = Json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
       "special_tokens": {"<|begin_of_text|>":
           {"id": "<|begin_of_text|>", "ids": [128000], "tokens": ["<|begin_of_text|>"]}}}]})");
  const HuggingFaceTokenizer tok(write_json(dir, json));  // no tokenizer_config.json here: names found by default
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{128000, 9906, 1917}));
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{128000});
  EXPECT_EQ(tok.decode({128000, 9906, 1917}), "<|begin_of_text|>Hello world");
  EXPECT_EQ(tok.eod(), 128001);
  EXPECT_EQ(tok.bos(), 128000);
}

// GPT-2 in tokenizer.json form: same ids as GPT2BPETokenizer, but <|endoftext|> is an added token.
TEST(HuggingFaceTokenizer, Gpt2AsTokenizerJson) {
  const TempDir dir;
  Json json = small_tokenizer();
  json["model"]["vocab"] = read_json(tokenizer_fixture("gpt2/vocab.json"));
  std::ifstream merges_in(tokenizer_fixture("gpt2/merges.txt"));
  Json merges = Json::array();
  std::string line;
  std::getline(merges_in, line);  // #version
  while (std::getline(merges_in, line)) {
    if (!line.empty()) merges.push_back(line);
  }
  json["model"]["merges"] = merges;
  json["added_tokens"] = Json::array({added(50256, "<|endoftext|>")});
  const HuggingFaceTokenizer tok(write_json(dir, json));
  const GPT2BPETokenizer gpt2(tokenizer_fixture("gpt2/vocab.json"), tokenizer_fixture("gpt2/merges.txt"));
  const std::string text = "GPT-2's tokenizer: 12345678 h\xC3\xA9llo  \n\t w\xC3\xB6rld \xF0\x9F\xA4\x97";
  EXPECT_EQ(tok.encode(text), gpt2.encode(text));
  EXPECT_EQ(tok.encode("<|endoftext|>"), std::vector<int32_t>{50256});
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eod(), 50256);
  EXPECT_FALSE(tok.bos().has_value());
}

TEST(HuggingFaceTokenizer, BothMergeEncodingsGiveTheSameIds) {
  const TempDir dir;
  Json json = small_tokenizer();
  const HuggingFaceTokenizer strings(write_json(dir, json, "strings.json"));
  Json pairs = Json::array();
  for (const Json& m : json["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  json["model"]["merges"] = pairs;
  json["model"].erase("type");  // old files: a model with vocab and merges is BPE
  const HuggingFaceTokenizer arrays(write_json(dir, json, "pairs.json"));
  const std::vector<int32_t> expected = {259, 260, 'o', 'r', 'l', 'd'};  // hello, " w", o, r, l, d
  EXPECT_EQ(strings.encode("hello world"), expected);
  EXPECT_EQ(arrays.encode("hello world"), expected);
  EXPECT_EQ(strings.decode(expected), "hello world");
}

TEST(HuggingFaceTokenizer, AddedTokensMatchLeftmostLongestWithStripping) {
  const TempDir dir;
  Json json = small_tokenizer();
  Json lstrip = added(263, "<x>");
  lstrip["lstrip"] = true;
  lstrip["rstrip"] = true;
  Json normalized = added(264, "ell", false);
  normalized["normalized"] = true;
  json["added_tokens"] = {added(261, "<|endoftext|>"), added(262, "<|end"), lstrip, normalized};
  const HuggingFaceTokenizer tok(write_json(dir, json));
  EXPECT_EQ(tok.vocab_size(), 265);
  EXPECT_EQ(tok.encode("<|endoftext|>"), std::vector<int32_t>{261});           // longest wins
  EXPECT_EQ(tok.encode("<|end|>"), (std::vector<int32_t>{262, '|', '>'}));     // the shorter one
  EXPECT_EQ(tok.encode("h  <x>\n o"), (std::vector<int32_t>{'h', 263, 'o'}));  // spaces swallowed
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{'h', 264, 'o'}));       // matched before BPE
  EXPECT_EQ(tok.decode({'h', 263, 'o'}), "h<x>o");
  EXPECT_EQ(tok.special_tokens(), (std::vector<SpecialToken>{{"<|endoftext|>", 261}, {"<|end", 262}, {"<x>", 263}}));
}

TEST(HuggingFaceTokenizer, PreTokenizerSequenceSplitAndPrefixSpace) {
  const TempDir dir;
  Json json = small_tokenizer();
  // Split on digits (Isolated), then ByteLevel with a prefix space and no regex.
  json["pre_tokenizer"] = Json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{N}"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": false}]})");
  const HuggingFaceTokenizer tok(write_json(dir, json));
  // "hello1w" -> "hello" "1" "w" -> " hello" " 1" " w": the prefix stops "hello" from merging whole.
  EXPECT_EQ(tok.encode("hello1w"), (std::vector<int32_t>{' ', 259, ' ', '1', 260}));
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", "l"}};
  json["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  json["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = false;
  const HuggingFaceTokenizer removed(write_json(dir, json));
  EXPECT_EQ(removed.encode("hello"), (std::vector<int32_t>{256, 'o'}));
}

TEST(HuggingFaceTokenizer, MalformedAndUnsupportedFilesGiveClearErrors) {
  const TempDir dir;
  const auto error_for = [&](const Json& json) {
    return error_of([&] { HuggingFaceTokenizer{write_json(dir, json)}; });
  };
  const auto expect_error = [&](const Json& json, const std::string& part) {
    const std::string error = error_for(json);
    EXPECT_NE(error.find(part), std::string::npos) << error;
  };
  std::ofstream(dir / "broken.json") << "{\"model\": {";
  EXPECT_NE(error_of([&] { HuggingFaceTokenizer{dir / "broken.json"}; }).find("is not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([&] { HuggingFaceTokenizer{dir / "missing.json"}; }).find("is not a readable file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { HuggingFaceTokenizer{dir.path()}; }).find("tokenizer.json' is not a readable file"),
            std::string::npos);

  Json j = small_tokenizer();
  j["model"]["type"] = "WordPiece";
  expect_error(j, "unknown model type 'WordPiece'");
  j = small_tokenizer();
  j["normalizer"] = {{"type", "NFC"}};
  expect_error(j, "normalizer: is set");
  j = small_tokenizer();
  j["decoder"] = {{"type", "Metaspace"}};
  expect_error(j, "decoder: must be ByteLevel");
  j = small_tokenizer();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(j, "pre-tokenizer type 'Whitespace' is not supported");
  j = small_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}"}}}, {"behavior", "Isolated"}};
  expect_error(j, "has no ByteLevel step");
  j = small_tokenizer();
  j["model"]["merges"][1] = "l  l";
  expect_error(j, "model.merges[1]: merge 'l  l' must be two tokens separated by exactly one space");
  j = small_tokenizer();
  j["model"]["merges"].push_back("hello q");
  expect_error(j, "merge 5 'hello q' uses a token missing from the vocabulary ('helloq')");
  j = small_tokenizer();
  j["model"]["byte_fallback"] = true;
  expect_error(j, "use SentencePieceTokenizer");
  j = small_tokenizer();
  j["added_tokens"][0]["single_word"] = true;
  expect_error(j, "sets single_word");
  j = small_tokenizer();
  j["added_tokens"][0]["id"] = -3;
  expect_error(j, "added_tokens[0].id: expected a token id");
  j = small_tokenizer();
  j["model"].erase("vocab");
  expect_error(j, "model: missing field \"vocab\"");
  j = small_tokenizer();
  j["added_tokens"] = Json::array();
  expect_error(j, "has no end-of-document token");
  j = small_tokenizer();
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  expect_error(j, "post-processor type 'RobertaProcessing' is not supported");
}
