#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/datasets/gpt_dataset.h"
#include "megatron/datasets/indexed_dataset.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
namespace fs = std::filesystem;

namespace {

using megatron::testing::error_of;

class GPTDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("megatron_gpt_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    prefix_ = (dir_ / "data").string();
    // megatron-compat.md's GPTDataset setup: document i token k = i*100 + k.
    IndexedDatasetBuilder builder(prefix_, IndexDType::u16);
    for (int i = 0; i < 10; ++i) {
      std::vector<int32_t> ids;
      for (int k = 0; k < kLengths[size_t(i)]; ++k) ids.push_back(i * 100 + k);
      builder.add_document(ids);
    }
    builder.finalize();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The stream the samples of sequences [begin, end) are cut from, built independently.
  static std::vector<int32_t> stream(int begin, int end) {
    std::vector<int32_t> out;
    for (int i = begin; i < end; ++i) {
      for (int k = 0; k < kLengths[size_t(i)]; ++k) out.push_back(i * 100 + k);
    }
    return out;
  }

  static constexpr int kLengths[10] = {5, 3, 8, 2, 7, 4, 6, 9, 1, 5};
  fs::path dir_;
  std::string prefix_;
};

std::vector<std::vector<int32_t>> all_samples(const SampleSource& source) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t i = 0; i < source.size(); ++i) out.push_back(source.get(i).tokens);
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

TEST_F(GPTDatasetTest, SamplesAreOverlappingWindowsOfTheStream) {
  const IndexedDataset data = IndexedDataset::open(prefix_);
  const int64_t S = 4;
  const GPTDataset ds(data, {0, 6}, S, 1234, 0);
  const std::vector<int32_t> flat = stream(0, 6);  // 29 tokens
  ASSERT_EQ(ds.tokens_per_epoch(), 29);
  ASSERT_EQ(ds.samples_per_epoch(), (29 - 1) / S);  // the last full window ends at 28 + 1
  ASSERT_EQ(ds.size(), ds.samples_per_epoch());
  std::set<int64_t> starts;
  for (const auto& tokens : all_samples(ds)) {
    ASSERT_EQ(int64_t(tokens.size()), S + 1);
    // Find which window this is: it must be flat[k*S, k*S + S + 1) for exactly one k.
    int64_t found = -1;
    for (int64_t k = 0; (k + 1) * S < int64_t(flat.size()); ++k) {
      if (std::equal(tokens.begin(), tokens.end(), flat.begin() + k * S)) found = k;
    }
    ASSERT_GE(found, 0);
    starts.insert(found);
  }
  EXPECT_EQ(int64_t(starts.size()), ds.samples_per_epoch());  // each window once per epoch
}

TEST_F(GPTDatasetTest, EpochsRepeatTheShuffledOrder) {
  const GPTDataset ds(IndexedDataset::open(prefix_), {0, 6}, 4, 7, 20);
  const int64_t per_epoch = ds.samples_per_epoch();
  EXPECT_EQ(ds.num_epochs(), (20 + per_epoch - 1) / per_epoch);
  EXPECT_GE(ds.size(), 20);
  for (int64_t i = per_epoch; i < ds.size(); ++i) EXPECT_EQ(ds.get(i).tokens, ds.get(i % per_epoch).tokens);
  EXPECT_NE(error_of([&] { ds.get(ds.size()); }).find("out of range"), std::string::npos);
}

TEST_F(GPTDatasetTest, SamplesCrossSequencesAndSkipEmptyOnes) {
  {
    IndexedDatasetBuilder builder(prefix_ + "_gaps", IndexDType::i32);
    builder.add_document({1, 2, 3});
    builder.add_document({});
    builder.add_document({4}, {1});
    builder.add_document({5, 6, 7}, {0, 3});  // a zero-length sequence inside the stream
    builder.finalize();
  }
  const GPTDataset ds(IndexedDataset::open(prefix_ + "_gaps"), {0, 4}, 3, 1, 0);
  ASSERT_EQ(ds.samples_per_epoch(), 2);  // stream 1..7: windows [1,2,3,4] and [4,5,6,7]
  std::vector<std::vector<int32_t>> samples = all_samples(ds);
  std::sort(samples.begin(), samples.end());
  EXPECT_EQ(samples, (std::vector<std::vector<int32_t>>{{1, 2, 3, 4}, {4, 5, 6, 7}}));
}

TEST_F(GPTDatasetTest, SameSeedSameOrderOtherSeedOtherOrder) {
  const IndexedDataset data = IndexedDataset::open(prefix_);
  // S = 1 gives 43 windows over sequences 0..7: 43! orders, so two seeds agreeing is negligible.
  const GPTDataset a(data, {0, 8}, 1, 1234, 0), b(data, {0, 8}, 1, 1234, 0), c(data, {0, 8}, 1, 4321, 0);
  EXPECT_EQ(all_samples(a), all_samples(b));
  EXPECT_NE(all_samples(a), all_samples(c));
}

TEST_F(GPTDatasetTest, BuildSplitDatasetUsesMegatronSplits) {
  const auto valid = build_split_dataset({prefix_}, "60,20,20", 1, 4, 1234, 0);
  ASSERT_NE(valid, nullptr);
  const std::vector<int32_t> flat = stream(6, 8);  // valid = sequences 6 and 7: 15 tokens
  ASSERT_EQ(valid->size(), (15 - 1) / 4);
  for (const auto& tokens : all_samples(*valid)) {
    EXPECT_NE(std::search(flat.begin(), flat.end(), tokens.begin(), tokens.end()), flat.end());
  }
  EXPECT_EQ(build_split_dataset({prefix_}, "98,2,0", 2, 4, 1234, 0), nullptr);
}

TEST_F(GPTDatasetTest, BuildSplitDatasetErrors) {
  const std::string missing = error_of([&] { build_split_dataset({prefix_ + "_nope"}, "1", 0, 4, 1, 0); });
  EXPECT_NE(missing.find(prefix_ + "_nope.idx"), std::string::npos) << missing;
  const std::string blend = error_of([&] { build_split_dataset({"0.3", prefix_, "0.7", prefix_}, "1", 0, 4, 1, 0); });
  EXPECT_NE(blend.find("blending arrives with the data pipeline issue"), std::string::npos) << blend;
  const std::string tiny = error_of([&] { build_split_dataset({prefix_}, "98,2", 1, 4, 1, 0); });
  EXPECT_NE(tiny.find("gets no sequences"), std::string::npos) << tiny;  // round(0.2) = 0 sequences
  const std::string short_split = error_of([&] { build_split_dataset({prefix_}, "60,20,20", 2, 8, 1, 0); });
  EXPECT_NE(short_split.find("holds 6 tokens"), std::string::npos) << short_split;
  EXPECT_NE(short_split.find("--seq-length + 1 = 9"), std::string::npos) << short_split;
  EXPECT_NE(error_of([&] { build_split_dataset({prefix_}, "1", 3, 4, 1, 0); }).find("split index 3"),
            std::string::npos);
}

TEST(MockGPTDataset, DocumentsCountUpAndEndInEod) {
  const int64_t vocab = 50304, S = 64;  // vocab above the longest document: no wrap-around
  const MockGPTDataset ds(vocab, S, 1234, 1000);
  EXPECT_GE(ds.size(), 1000);
  int64_t eods = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    const std::vector<int32_t> t = ds.get(i).tokens;
    ASSERT_EQ(int64_t(t.size()), S + 1);
    for (size_t k = 0; k + 1 < t.size(); ++k) {
      // Inside a document ids count up by one; after EOD the next document starts at 1 (or,
      // for a one-token document, is EOD again).
      if (t[k] == vocab - 1) {
        ++eods;
        EXPECT_TRUE(t[k + 1] == 1 || t[k + 1] == vocab - 1) << "sample " << i << " position " << k;
      } else {
        EXPECT_TRUE(t[k + 1] == t[k] + 1 || t[k + 1] == vocab - 1) << "sample " << i << " position " << k;
      }
    }
  }
  // Documents average ~2048 tokens, so 1000 windows of 64 inputs meet about 1000 * 64 / 2048 =
  // 31 EODs: some (zero would mean documents never end), far fewer than 200.
  EXPECT_GT(eods, 0);
  EXPECT_LT(eods, 200);
}

TEST(MockGPTDataset, DeterministicPerSeedAndSplit) {
  const MockGPTDataset a(1000, 32, 1, 0), b(1000, 32, 1, 0), c(1000, 32, 2, 0);
  const MockGPTDataset valid(1000, 32, 1, 0, Split::valid);
  for (int64_t i : {0, 1, 17, 12345}) EXPECT_EQ(a.get(i).tokens, b.get(i).tokens);
  bool seed_differs = false, split_differs = false;
  for (int64_t i = 0; i < 8; ++i) {
    seed_differs |= a.get(i).tokens != c.get(i).tokens;
    split_differs |= a.get(i).tokens != valid.get(i).tokens;
  }
  EXPECT_TRUE(seed_differs);
  EXPECT_TRUE(split_differs);
  EXPECT_NE(a.tokens_per_epoch(), valid.tokens_per_epoch());
}

TEST_F(GPTDatasetTest, BatchShiftsLabelsAndMasksAfterEod) {
  const GPTDataset ds(IndexedDataset::open(prefix_), {0, 6}, 4, 1234, 0);
  const std::vector<int64_t> indices = {3, 0, 5};
  const int32_t eod = 102;  // treat token 102 (sequence 1, position 2) as EOD for the mask
  const Batch batch = make_batch(ds, indices, eod, /*eod_mask_loss=*/true);
  ASSERT_EQ(batch.tokens.shape(), (Shape{3, 4}));
  ASSERT_EQ(batch.labels.shape(), (Shape{3, 4}));
  ASSERT_EQ(batch.loss_mask.shape(), (Shape{3, 4}));
  EXPECT_EQ(batch.tokens.dtype(), DType::i32);
  EXPECT_EQ(batch.loss_mask.dtype(), DType::f32);
  int masked = 0;
  for (int64_t r = 0; r < 3; ++r) {
    const std::vector<int32_t> sample = ds.get(indices[size_t(r)]).tokens;
    for (int64_t t = 0; t < 4; ++t) {
      EXPECT_EQ(batch.tokens.data<int32_t>()[r * 4 + t], sample[size_t(t)]);
      EXPECT_EQ(batch.labels.data<int32_t>()[r * 4 + t], sample[size_t(t) + 1]);
      const float expected = sample[size_t(t)] == eod ? 0.0f : 1.0f;  // masked where the *input* is EOD
      EXPECT_EQ(batch.loss_mask.data<float>()[r * 4 + t], expected);
      masked += expected == 0.0f;
    }
  }
  // Every window of sequences 0..5 is used once per epoch; 102 is an input of exactly one of
  // them. Check the whole epoch so the masking branch is exercised whatever the order.
  std::vector<int64_t> every(size_t(ds.size()));
  for (size_t i = 0; i < every.size(); ++i) every[i] = int64_t(i);
  const Batch all = make_batch(ds, every, eod, true);
  int zeros = 0;
  for (float v : all.loss_mask.to_vector()) zeros += v == 0.0f;
  EXPECT_EQ(zeros, 1);
  const Batch unmasked = make_batch(ds, every, eod, false);
  for (float v : unmasked.loss_mask.to_vector()) EXPECT_EQ(v, 1.0f);
  EXPECT_LE(masked, 1);
}
