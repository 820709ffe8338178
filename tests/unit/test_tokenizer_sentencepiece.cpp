// The SentencePiece tokenizers on a small BPE model written here byte by byte in the
// ModelProto format (interop-formats.md 5.6), so the expected ids follow by hand from
// SentencePiece's BPE rule: merge the adjacent pair whose joined piece has the highest score.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "megatron/datasets/tokenizers/sentencepiece_tokenizer.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;
using megatron::testing::TempDir;

namespace {

// Protocol buffer wire format: varints, length-delimited fields, 32-bit floats.
std::string varint(uint64_t v) {
  std::string s;
  do {
    s += char((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
    v >>= 7;
  } while (v != 0);
  return s;
}
std::string tag(int field, int wire) { return varint(uint64_t(field) << 3 | uint64_t(wire)); }
std::string bytes_field(int field, const std::string& b) { return tag(field, 2) + varint(b.size()) + b; }
std::string int_field(int field, int64_t v) { return tag(field, 0) + varint(uint64_t(v)); }
std::string float_field(int field, float v) {
  char b[4];
  std::memcpy(b, &v, 4);
  return tag(field, 5) + std::string(b, 4);
}

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Types: 1 NORMAL, 2 UNKNOWN, 3 CONTROL. Ids are the list order.
std::string model_proto() {
  const std::vector<std::tuple<std::string, float, int>> pieces = {
      {"<unk>", 0, 2}, {"<s>", 0, 3},         {"</s>", 0, 3}, {kSpace, -1, 1},
      {"h", -2, 1},    {"e", -3, 1},          {"l", -4, 1},   {"o", -5, 1},
      {"w", -6, 1},    {"r", -7, 1},          {"d", -8, 1},   {"ll", 10, 1},
      {"he", 9, 1},    {kSpace + "he", 8, 1}, {"llo", 7, 1},  {kSpace + "hello", 6, 1},
      {"wo", 5, 1},    {kSpace + "wo", 4, 1},
  };
  std::string proto;
  for (const auto& [piece, score, type] : pieces) {
    proto += bytes_field(1, bytes_field(1, piece) + float_field(2, score) + int_field(3, type));
  }
  // trainer_spec: model_type BPE, vocab_size, unk/bos/eos/pad ids (pad -1: none).
  proto += bytes_field(2, int_field(3, 2) + int_field(4, int64_t(pieces.size())) + int_field(40, 0) + int_field(41, 1) +
                              int_field(42, 2) + int_field(43, -1));
  // normalizer_spec: identity, dummy prefix, spaces kept and escaped.
  proto += bytes_field(3, bytes_field(1, "identity") + int_field(3, 1) + int_field(4, 0) + int_field(5, 1));
  return proto;
}

struct Model {
  TempDir dir;
  std::string path = dir / "tokenizer.model";
  Model() { std::ofstream(path, std::ios::binary) << model_proto(); }
};

}  // namespace

// "hello world" -> ▁hello▁world -> merges ll, he, ▁he, llo, ▁hello, wo, ▁wo -> ▁hello ▁wo r l d.
TEST(SentencePieceTokenizer, GptFlavorGivesTheModelsIds) {
  const Model model;
  const SentencePieceTokenizer tok(model.path, SentencePieceTokenizer::Flavor::gpt);
  EXPECT_EQ(tok.name(), "GPTSentencePieceTokenizer");
  EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{15, 17, 9, 6, 10}));
  EXPECT_EQ(tok.decode({15, 17, 9, 6, 10}), "hello world");
  EXPECT_EQ(tok.vocab_size(), 18);
  EXPECT_EQ(tok.eod(), 2);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_TRUE(tok.special_tokens().empty());
  EXPECT_EQ(tok.encode("hello z"), (std::vector<int32_t>{15, 3, 0}));  // z is unknown
}

TEST(SentencePieceTokenizer, Llama2FlavorPrependsBos) {
  const Model model;
  const SentencePieceTokenizer tok(model.path, SentencePieceTokenizer::Flavor::llama2);
  EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{1, 15, 17, 9, 6, 10}));
  EXPECT_EQ(tok.decode(tok.encode("hello world")), "hello world");  // control pieces decode to nothing
  EXPECT_EQ(tok.eod(), 2);
}

// Megatron appends <CLS> <SEP> <EOD> <MASK> <PAD> (the model has no pad); <s> and </s> exist.
TEST(SentencePieceTokenizer, MegatronFlavorAddsSpecialTokens) {
  const Model model;
  const SentencePieceTokenizer tok(model.path, SentencePieceTokenizer::Flavor::megatron);
  EXPECT_EQ(tok.name(), "SentencePieceTokenizer");
  EXPECT_EQ(tok.vocab_size(), 23);
  EXPECT_EQ(tok.eod(), 20);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.special_tokens(),
            (std::vector<SpecialToken>{
                {"<CLS>", 18}, {"<SEP>", 19}, {"<EOD>", 20}, {"<MASK>", 21}, {"<PAD>", 22}, {"<s>", 1}, {"</s>", 2}}));
  const std::vector<int32_t> ids = tok.encode("hello<EOD>world</s>");
  EXPECT_EQ(ids, (std::vector<int32_t>{15, 20, 17, 9, 6, 10, 2}));
  EXPECT_EQ(tok.decode(ids), "hello <EOD> world </s> ");
}

TEST(SentencePieceTokenizer, ErrorsNameTheFile) {
  const TempDir dir;
  std::string error =
      error_of([&] { SentencePieceTokenizer(dir / "none.model", SentencePieceTokenizer::Flavor::gpt); });
  EXPECT_NE(error.find("none.model' is not a readable file"), std::string::npos) << error;
  std::ofstream(dir / "junk.model", std::ios::binary) << "this is not a protobuf";
  error = error_of([&] { SentencePieceTokenizer(dir / "junk.model", SentencePieceTokenizer::Flavor::megatron); });
  EXPECT_NE(error.find("is not a SentencePiece model"), std::string::npos) << error;
  const Model model;
  const SentencePieceTokenizer tok(model.path, SentencePieceTokenizer::Flavor::gpt);
  EXPECT_NE(error_of([&] { tok.encode("a\xFF"); }).find("not valid UTF-8: byte 0xFF at offset 1"), std::string::npos);
  EXPECT_NE(error_of([&] { tok.decode({18}); }).find("cannot decode id 18"), std::string::npos);
}

TEST(SentencePieceTokenizer, FactoryNeedsTheModel) {
  const Model model;
  EXPECT_EQ(make_tokenizer("Llama2Tokenizer", 0, model.path)->encode("hello"), (std::vector<int32_t>{1, 15}));
  EXPECT_EQ(make_tokenizer("SentencePieceTokenizer", 23, model.path)->vocab_size(), 23);
  EXPECT_NE(error_of([] { make_tokenizer("GPTSentencePieceTokenizer", 0, ""); }).find("needs --tokenizer-model"),
            std::string::npos);
}
