// GPTDataset against megatron-compat.md section 2 (known answers produced by Megatron-LM) and
// against the closed form of its sample index, plus mock data (section 3) and batching.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/datasets/blended_dataset.h"
#include "megatron/datasets/gpt_dataset.h"
#include "megatron/datasets/indexed_dataset.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;
using megatron::testing::TempDir;

namespace {

constexpr int kLengths[10] = {5, 3, 8, 2, 7, 4, 6, 9, 1, 5};

// megatron-compat.md's corpus: 10 one-sequence documents, document i token k = i*100 + k.
std::string write_corpus(const TempDir& dir) {
  const std::string prefix = dir / "corpus";
  IndexedDatasetBuilder builder(prefix, IndexDType::u16);
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> ids;
    for (int k = 0; k < kLengths[i]; ++k) ids.push_back(i * 100 + k);
    builder.add_document(ids);
  }
  builder.finalize();
  return prefix;
}

GPTDataConfig corpus_config(const std::string& prefix, const TempDir& dir) {
  GPTDataConfig config;
  config.data_path = {prefix};
  config.split = "60,20,20";
  config.seq_length = 4;
  config.seed = 1234;
  config.data_cache_path = dir / "cache";
  return config;
}

const GPTDataset& as_gpt(const std::unique_ptr<SampleSource>& source) {
  const auto* gpt = dynamic_cast<const GPTDataset*>(source.get());
  EXPECT_NE(gpt, nullptr);
  return *gpt;
}

std::vector<int64_t> pairs(std::initializer_list<std::pair<int64_t, int64_t>> rows) {
  std::vector<int64_t> out;
  for (const auto& [a, b] : rows) {
    out.push_back(a);
    out.push_back(b);
  }
  return out;
}

}  // namespace

TEST(SplitParsing, KnownAnswers) {
  const SplitMatrix m = parse_split("969,30,1");
  ASSERT_TRUE(m[0] && m[1] && m[2]);
  // Exact: these are the float64 operations Megatron performs (969/1000, then running sums).
  EXPECT_EQ(m[0]->first, 0.0);
  EXPECT_EQ(m[0]->second, 969.0 / 1000.0);
  EXPECT_EQ(m[1]->second, 969.0 / 1000.0 + 30.0 / 1000.0);
  EXPECT_EQ(split_range(m, Split::train, 1000), (SequenceRange{0, 969}));
  EXPECT_EQ(split_range(m, Split::valid, 1000), (SequenceRange{969, 999}));
  EXPECT_EQ(split_range(m, Split::test, 1000), (SequenceRange{999, 1000}));
  EXPECT_EQ(parse_split("969 30 1"), m);  // any separator
  EXPECT_EQ(parse_split("[969; 30; 1]"), m);

  const SplitMatrix no_test = parse_split("98,2,0");
  EXPECT_TRUE(no_test[1]);
  EXPECT_FALSE(no_test[2]);
  EXPECT_EQ(split_range(no_test, Split::test, 100), std::nullopt);
  EXPECT_FALSE(parse_split("100")[1]);  // padded with zeros

  const SplitMatrix thirds = parse_split("1,1,1");  // Megatron's mock split of 100,000 documents
  EXPECT_EQ(split_range(thirds, Split::train, 100000), (SequenceRange{0, 33333}));
  EXPECT_EQ(split_range(thirds, Split::valid, 100000), (SequenceRange{33333, 66667}));
  EXPECT_EQ(split_range(thirds, Split::test, 100000), (SequenceRange{66667, 100000}));
  EXPECT_EQ(split_range(parse_split("60,20,20"), Split::valid, 10), (SequenceRange{6, 8}));
}

TEST(SplitParsing, RoundsHalfToEvenLikePython) {
  const SplitMatrix halves = parse_split("1,1");
  EXPECT_EQ(split_range(halves, Split::train, 5), (SequenceRange{0, 2}));  // round(2.5) = 2
  EXPECT_EQ(split_range(halves, Split::valid, 5), (SequenceRange{2, 5}));
  EXPECT_EQ(split_range(halves, Split::train, 7), (SequenceRange{0, 4}));  // round(3.5) = 4
}

TEST(SplitParsing, BadStringsAreRejected) {
  EXPECT_NE(error_of([] { parse_split(""); }).find("0 weights"), std::string::npos);
  EXPECT_NE(error_of([] { parse_split("1,2,3,4"); }).find("4 weights"), std::string::npos);
  EXPECT_NE(error_of([] { parse_split("0,0,0"); }).find("sum to 0"), std::string::npos);
  EXPECT_NE(error_of([] { parse_split("1.2.3,1"); }).find("'1.2.3' is not a number"), std::string::npos);
}

TEST(SplitParsing, MatrixJsonStartsWithPythonsIntegerZero) {
  EXPECT_EQ(split_matrix_json(parse_split("60,20,20")).dump(), "[[0,0.6],[0.6,0.8],[0.8,1.0]]");
  EXPECT_EQ(split_matrix_json(parse_split("0,1,0")).dump(), "[null,[0.0,1.0],null]");
}

TEST(EpochPlan, SeparateFinalEpochRule) {
  // The train split of the known-answer corpus: T = 29, S = 4, 30 samples wanted.
  const EpochPlan train = plan_epochs(29, 30, 4, "train");
  EXPECT_EQ(train.num_epochs, 5);  // 5 * 29 >= 30 * 4 + 1
  EXPECT_EQ(train.samples_before_final_epoch, 28);
  EXPECT_TRUE(train.separate_final_epoch);  // 30 - 28 = 2 < int(0.8 * 7) = 5
  EXPECT_EQ(train.total_samples, 36);       // the whole of 5 epochs, not the 30 asked for
  const EpochPlan valid = plan_epochs(15, 5, 4, "valid");
  EXPECT_EQ(valid.num_epochs, 2);
  EXPECT_FALSE(valid.separate_final_epoch);  // 5 - 3 = 2 < int(0.8 * 3) = 2 is false
  EXPECT_EQ(valid.total_samples, 7);
  const EpochPlan one = plan_epochs(29, std::nullopt, 4, "x");
  EXPECT_EQ(one.num_epochs, 1);
  EXPECT_EQ(one.total_samples, 7);
  EXPECT_NE(error_of([] { plan_epochs(1, 5, 4, "split test of d"); }).find("split test of d holds 1 tokens"),
            std::string::npos);
}

TEST(GPTDataset, KnownAnswersOfMegatron) {
  TempDir dir;
  const std::string prefix = write_corpus(dir);
  const GPTDataConfig config = corpus_config(prefix, dir);

  const auto train_source = build_gpt_dataset(config, Split::train, 30);
  const GPTDataset& train = as_gpt(train_source);
  EXPECT_EQ(train.size(), 36);
  EXPECT_EQ(train.document_index().to_vector(), (std::vector<int64_t>{1, 4, 2, 3, 1, 0, 5, 4, 0, 2, 1, 3, 4, 4, 2,
                                                                      2, 5, 3, 5, 5, 0, 0, 1, 3, 5, 1, 4, 3, 0, 2}));
  EXPECT_EQ(train.sample_index().to_vector(),
            pairs({{0, 0},  {1, 1},  {1, 5},  {2, 2},  {2, 6},  {4, 0},  {5, 1},  {6, 0},  {7, 0},  {7, 4},
                   {8, 1},  {9, 0},  {9, 4},  {10, 0}, {11, 1}, {12, 3}, {13, 0}, {13, 4}, {14, 1}, {14, 5},
                   {15, 1}, {15, 5}, {16, 1}, {17, 1}, {18, 3}, {19, 3}, {20, 3}, {21, 2}, {22, 1}, {24, 0},
                   {25, 0}, {26, 1}, {26, 5}, {28, 0}, {28, 4}, {29, 3}, {29, 7}}));
  EXPECT_EQ(train.shuffle_index().to_vector(),
            (std::vector<int64_t>{26, 22, 5,  19, 8, 21, 17, 4, 24, 13, 15, 10, 14, 18, 20, 1,  12, 27,
                                  25, 16, 23, 9,  0, 11, 7,  3, 6,  2,  35, 30, 34, 31, 29, 33, 32, 28}));
  EXPECT_EQ(train.document_index().type(), IndexType::i32);
  EXPECT_EQ(train.sample_index().type(), IndexType::i32);
  EXPECT_EQ(train.shuffle_index().type(), IndexType::u32);
  // Sample 0 is sample 26: rows (20, 3) to (21, 2), documents 0 and 0 again.
  EXPECT_EQ(train.get(0), (std::vector<int32_t>{3, 4, 0, 1, 2}));

  const auto valid_source = build_gpt_dataset(config, Split::valid, 5);
  const GPTDataset& valid = as_gpt(valid_source);
  EXPECT_EQ(valid.document_index().to_vector(), (std::vector<int64_t>{6, 7, 6, 7}));
  EXPECT_EQ(valid.sample_index().to_vector(), pairs({{0, 0}, {0, 4}, {1, 2}, {1, 6}, {2, 1}, {2, 5}, {3, 3}, {3, 7}}));
  EXPECT_EQ(valid.shuffle_index().to_vector(), (std::vector<int64_t>{5, 2, 3, 1, 0, 6, 4}));

  const auto test_source = build_gpt_dataset(config, Split::test, 5);
  const GPTDataset& test = as_gpt(test_source);
  EXPECT_EQ(test.document_index().to_vector(), (std::vector<int64_t>{8, 9, 8, 8, 8, 9, 9, 9}));
  EXPECT_EQ(test.sample_index().to_vector(), pairs({{0, 0}, {1, 3}, {4, 0}, {5, 3}, {6, 2}, {7, 1}}));
  EXPECT_EQ(test.shuffle_index().to_vector(), (std::vector<int64_t>{2, 0, 4, 3, 1}));
}

TEST(GPTDataset, SamplesAreWindowsOfTheShuffledDocumentStream) {
  // A corpus with empty sequences; every configuration must satisfy the closed form: with F the
  // documents concatenated in document-index order, sample index row k >= 1 is the (position,
  // offset) of F[k*S] (offset inside a non-empty document; row 0 is always (0, 0), even on an
  // empty document) and shuffled sample i is F[k*S, k*S + S] with k = shuffle_index[i].
  TempDir dir;
  const std::string prefix = dir / "gaps";
  std::vector<int32_t> lengths;
  {
    IndexedDatasetBuilder builder(prefix, IndexDType::i32);
    for (int i = 0; i < 14; ++i) {
      const int length = (i * 7) % 5 == 0 ? 0 : 1 + (i * 5) % 9;
      std::vector<int32_t> ids;
      for (int k = 0; k < length; ++k) ids.push_back(1000 * i + k);
      builder.add_document(ids, {int64_t(length)});
      lengths.push_back(length);
    }
    builder.finalize();
  }
  const auto data = open_indexed_sequences(prefix);
  for (int64_t seed : {1, 7, 1234}) {
    for (int64_t S : {1, 3, 4, 16}) {
      for (std::optional<int64_t> wanted : {std::optional<int64_t>(), std::optional<int64_t>(9),
                                            std::optional<int64_t>(40), std::optional<int64_t>(200)}) {
        GPTDatasetConfig config;
        config.seq_length = S;
        config.seed = seed;
        config.cache_path = dir / "cache";
        const GPTDataset ds(data, {2, 14}, Split::train, wanted, config);
        SCOPED_TRACE("seed " + std::to_string(seed) + " S " + std::to_string(S));
        const IndexArray& doc = ds.document_index();
        std::vector<int32_t> flat;
        std::vector<std::pair<int64_t, int64_t>> where;  // (position, offset) of each flat token
        std::map<int64_t, int64_t> uses;
        for (int64_t p = 0; p < doc.size(); ++p) {
          ++uses[doc[p]];
          for (int64_t k = 0; k < lengths[size_t(doc[p])]; ++k) {
            flat.push_back(int32_t(1000 * doc[p] + k));
            where.emplace_back(p, k);
          }
        }
        for (const auto& [document, count] : uses) EXPECT_EQ(count, ds.plan().num_epochs) << "document " << document;
        EXPECT_EQ(int64_t(uses.size()), 12);
        ASSERT_EQ(ds.size(), (int64_t(flat.size()) - 1) / S);
        if (wanted) {
          EXPECT_GE(ds.size(), *wanted);
        }
        EXPECT_EQ(ds.sample_index().at(0, 0), 0);
        EXPECT_EQ(ds.sample_index().at(0, 1), 0);
        for (int64_t k = 1; k <= ds.size(); ++k) {
          ASSERT_EQ(ds.sample_index().at(k, 0), where[size_t(k * S)].first) << "row " << k;
          ASSERT_EQ(ds.sample_index().at(k, 1), where[size_t(k * S)].second) << "row " << k;
        }
        std::vector<int64_t> order = ds.shuffle_index().to_vector();
        for (int64_t i = 0; i < ds.size(); ++i) {
          const int64_t k = order[size_t(i)];
          const std::vector<int32_t> expected(flat.begin() + k * S, flat.begin() + k * S + S + 1);
          ASSERT_EQ(ds.get(i), expected) << "sample " << i;
        }
        std::sort(order.begin(), order.end());
        for (int64_t i = 0; i < ds.size(); ++i) ASSERT_EQ(order[size_t(i)], i);
        // Valid indices pass the checks a cached copy must pass.
        EXPECT_TRUE(GPTDataset(data, {2, 14}, Split::train, wanted, config).loaded_from_cache());
      }
    }
  }
}

TEST(GPTDataset, ErrorsNameTheFix) {
  TempDir dir;
  const std::string prefix = write_corpus(dir);
  GPTDataConfig config = corpus_config(prefix, dir);
  config.data_path = {prefix + "_nope"};
  const std::string missing = error_of([&] { build_gpt_dataset(config, Split::train, 1); });
  EXPECT_NE(missing.find(prefix + "_nope.idx"), std::string::npos) << missing;
  config.data_path = {prefix};
  config.split = "98,2";
  const std::string tiny = error_of([&] { build_gpt_dataset(config, Split::valid, 1); });
  EXPECT_NE(tiny.find("gets no sequences"), std::string::npos) << tiny;  // round(0.2) = 0 sequences
  EXPECT_EQ(build_gpt_dataset(config, Split::test, 1), nullptr);         // zero weight: not built
  config.split = "80,10,10";                                             // test split = document 9 alone
  const auto test = build_gpt_dataset(config, Split::test, 1);
  EXPECT_NE(error_of([&] { test->get(test->size()); }).find("out of range"), std::string::npos);
}

TEST(MockGPTDataset, MatchesMegatronsMockData) {
  GPTDataConfig config;
  config.mock_data = true;
  config.seq_length = 8;
  config.seed = 1234;
  // Megatron's sample-0 vector was taken with a 1000-id vocabulary: the sample starts at offset
  // 1102 of its document, whose ids count up modulo the vocabulary size.
  config.vocab_size = 1000;
  config.eod = 999;
  const auto train_source = build_gpt_dataset(config, Split::train, 1);
  const GPTDataset& train = as_gpt(train_source);
  EXPECT_EQ(train.identifiers()["class"], "MockGPTDataset");
  EXPECT_EQ(train.plan().num_epochs, 1);
  const std::vector<int64_t> documents = train.document_index().to_vector();
  EXPECT_EQ(documents.size(), 33333u);
  EXPECT_EQ(std::vector<int64_t>(documents.begin(), documents.begin() + 5),
            (std::vector<int64_t>{30903, 11571, 3134, 32473, 27454}));
  const std::vector<int32_t> sample = train.get(0);
  EXPECT_EQ(std::vector<int32_t>(sample.begin(), sample.end() - 1),
            (std::vector<int32_t>{103, 104, 105, 106, 107, 108, 109, 110}));
  EXPECT_FALSE(train.loaded_from_cache());
}

TEST(MockGPTDataset, DocumentsCountUpModuloVocabAndEndInEod) {
  const auto mock = mock_sequences(100, 99);
  ASSERT_EQ(mock->num_sequences(), kMockNumDocuments);
  ASSERT_EQ(mock->sequence_length(0), 3484);  // default_rng(0)'s first length
  std::vector<int32_t> document(3484);
  mock->read(0, 0, 3484, document.data());
  for (int64_t k = 0; k + 1 < 3484; ++k) ASSERT_EQ(document[size_t(k)], (k + 1) % 100) << k;
  EXPECT_EQ(document.back(), 99);
  std::vector<int32_t> tail(2);
  mock->read(0, 3482, 2, tail.data());
  EXPECT_EQ(tail, (std::vector<int32_t>{3483 % 100, 99}));
}

namespace {

// One fixed sample at every index.
class FixedSample final : public SampleSource {
 public:
  explicit FixedSample(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
  int64_t size() const override { return 4; }
  int64_t sample_length() const override { return int64_t(tokens_.size()); }
  void read(int64_t, int32_t* out) const override { std::copy(tokens_.begin(), tokens_.end(), out); }

 private:
  std::vector<int32_t> tokens_;
};

std::vector<int32_t> ints(const Tensor& t) {
  std::vector<int32_t> out(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  return out;
}

}  // namespace

TEST(MakeBatch, MasksPositionsAndSegmentsAsMegatron) {
  // EODs (id 2) at input positions 1, 4 and 5; worked by hand from Megatron's loop.
  const FixedSample source({5, 2, 7, 8, 2, 2, 9, 4});
  BatchOptions options;
  options.eod = 2;
  const std::vector<int64_t> rows = {0, 3};
  Batch plain = make_batch(source, rows, options);
  EXPECT_EQ(plain.tokens.shape(), (Shape{2, 7}));
  EXPECT_EQ(ints(plain.tokens), (std::vector<int32_t>{5, 2, 7, 8, 2, 2, 9, 5, 2, 7, 8, 2, 2, 9}));
  EXPECT_EQ(ints(plain.labels), (std::vector<int32_t>{2, 7, 8, 2, 2, 9, 4, 2, 7, 8, 2, 2, 9, 4}));
  EXPECT_EQ(plain.loss_mask.to_vector(), std::vector<float>(14, 1.0f));
  EXPECT_EQ(ints(plain.position_ids), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6}));
  EXPECT_FALSE(plain.segment_ids.defined());

  options.eod_mask_loss = true;
  options.reset_position_ids = true;
  options.reset_attention_mask = true;
  Batch reset = make_batch(source, std::vector<int64_t>{1}, options);
  EXPECT_EQ(reset.loss_mask.to_vector(), (std::vector<float>{1, 0, 1, 1, 0, 0, 1}));
  EXPECT_EQ(ints(reset.position_ids), (std::vector<int32_t>{0, 1, 0, 1, 2, 0, 0}));
  EXPECT_EQ(ints(reset.segment_ids), (std::vector<int32_t>{0, 0, 1, 1, 1, 2, 3}));

  // A tokenizer pad id (here 9): its labels are untrained, and pads read as id 0.
  options.pad = 9;
  Batch padded = make_batch(source, std::vector<int64_t>{1}, options);
  EXPECT_EQ(padded.loss_mask.to_vector(), (std::vector<float>{1, 0, 1, 1, 0, 0, 1}));  // label 9 at t=5 (EOD input)
  options.eod_mask_loss = false;
  padded = make_batch(source, std::vector<int64_t>{1}, options);
  EXPECT_EQ(padded.loss_mask.to_vector(), (std::vector<float>{1, 1, 1, 1, 1, 0, 1}));
  EXPECT_EQ(ints(padded.tokens), (std::vector<int32_t>{5, 2, 7, 8, 2, 2, 0}));
  EXPECT_EQ(ints(padded.labels), (std::vector<int32_t>{2, 7, 8, 2, 2, 0, 4}));
}

TEST(TransitionalEntryPoints, AgreeWithTheBuilder) {
  TempDir dir;
  const std::string prefix = write_corpus(dir);
  const auto old_train = build_split_dataset({prefix}, "60,20,20", 0, 4, 1234, 30);
  const auto train = build_gpt_dataset(corpus_config(prefix, dir), Split::train, 30);
  ASSERT_EQ(old_train->size(), train->size());
  for (int64_t i = 0; i < train->size(); ++i) EXPECT_EQ(old_train->get(i), train->get(i));
  EXPECT_NE(error_of([&] { build_split_dataset({prefix}, "1", 3, 4, 1, 0); }).find("split index 3"), std::string::npos);
  const MockGPTDataset mock(1000, 8, 1234, 1);
  EXPECT_EQ(mock.get(0)[0], 103);
  const Batch batch = make_batch(*train, std::vector<int64_t>{0}, 4, true);
  EXPECT_EQ(batch.loss_mask.to_vector(), (std::vector<float>{1, 0, 1, 1}));  // sample 0 = 3, 4, 0, 1, 2
}
