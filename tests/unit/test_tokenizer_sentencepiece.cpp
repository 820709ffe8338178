// The SentencePiece tokenizers on the small BPE model of unit/sentencepiece_test_model.h, written
// byte by byte, so the expected ids follow by hand from SentencePiece's BPE rule: merge the
// adjacent pair whose joined piece has the highest score.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "megatron/datasets/tokenizers/sentencepiece_tokenizer.h"
#include "test_util.h"
#include "unit/sentencepiece_test_model.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;
using megatron::testing::sentencepiece_model_proto;
using megatron::testing::TempDir;

namespace {

struct Model {
  TempDir dir;
  std::string path = dir / "tokenizer.model";
  Model() { std::ofstream(path, std::ios::binary) << sentencepiece_model_proto(); }
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
