// Blending against megatron-compat.md section 2.8 (known answers produced by Megatron-LM) and
// the builder's routing of --data-path, per-split paths and mock data.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/datasets/blended_dataset.h"
#include "megatron/datasets/dataset_cache.h"
#include "megatron/datasets/indexed_dataset.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;
using megatron::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// One-sequence documents (ten, or the first `documents` of them: 4 hold 18 tokens, 4 samples
// of 4 + 1 at seq_length 4); document i token k = base + i*100 + k. All ten hold 50 tokens:
// (50 - 1) / 4 = 12 samples per epoch.
std::string write_corpus(const TempDir& dir, const std::string& name, int32_t base, int documents = 10) {
  const std::string prefix = dir / name;
  IndexedDatasetBuilder builder(prefix, IndexDType::i32);
  const int lengths[10] = {5, 3, 8, 2, 7, 4, 6, 9, 1, 5};
  for (int i = 0; i < documents; ++i) {
    std::vector<int32_t> ids;
    for (int k = 0; k < lengths[i]; ++k) ids.push_back(base + i * 100 + k);
    builder.add_document(ids);
  }
  builder.finalize();
  return prefix;
}

// The reference's build_blending_indices rule (megatron-compat.md section 2.8), written out
// here so the expected orders below do not come from the code under test: sample i goes to the
// dataset d maximising w_d * max(i, 1) - count_d, ties to the lowest d.
std::vector<int64_t> reference_blend_order(const std::vector<double>& w, int64_t size) {
  std::vector<int64_t> order, count(w.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    size_t best = 0;
    for (size_t d = 1; d < w.size(); ++d) {
      if (w[d] * double(std::max<int64_t>(i, 1)) - double(count[d]) >
          w[best] * double(std::max<int64_t>(i, 1)) - double(count[best]))
        best = d;
    }
    order.push_back(int64_t(best));
    ++count[best];
  }
  return order;
}

GPTDataConfig base_config(const TempDir& dir) {
  GPTDataConfig config;
  config.seq_length = 4;
  config.seed = 1234;
  config.split = "1";
  config.data_cache_path = dir / "cache";
  return config;
}

}  // namespace

TEST(Blend, ParsesLikeGetBlendFromList) {
  const Blend weighted = parse_blend({"0.7", " a ", "0.3", "b"});
  EXPECT_EQ(weighted.prefixes, (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(weighted.weights);
  EXPECT_EQ(*weighted.weights, (std::vector<double>{0.7, 0.3}));
  const Blend odd = parse_blend({"a", "b", "c"});
  EXPECT_EQ(odd.prefixes, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(odd.weights);
  const Blend words = parse_blend({"a", "b"});  // "a" is no number: all prefixes
  EXPECT_EQ(words.prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(words.weights);
  EXPECT_FALSE(parse_blend({"1", "a", "0x2", "b"}).weights);  // Python's float() rejects hex
  EXPECT_EQ(*parse_blend({"1e1", "a"}).weights, (std::vector<double>{10.0}));
}

TEST(Blend, NormalisesWithNumpysPairwiseSum) {
  const std::vector<double> three = normalize_weights({0.3, 0.3, 0.4});
  const double sequential = (0.3 + 0.3) + 0.4;
  EXPECT_EQ(three[0], 0.3 / sequential);
  // Ten weights of 0.1: numpy sums the first eight in a tree of eight accumulators, then adds
  // the rest, and gets exactly 1.0 where a left-to-right loop gets 0.9999999999999999.
  const std::vector<double> ten(10, 0.1);
  double left_to_right = 0.0;
  for (double w : ten) left_to_right += w;
  ASSERT_NE(left_to_right, 1.0);
  EXPECT_EQ(normalize_weights(ten), ten);
  EXPECT_NE(error_of([] { normalize_weights({0.5, -0.1}); }).find("must be a finite number >= 0"), std::string::npos);
  EXPECT_NE(error_of([] { normalize_weights({0.0, 0.0}); }).find("sum to 0"), std::string::npos);
}

TEST(Blend, BlendingIndicesKnownAnswers) {
  const BlendingIndices a = build_blending_indices({0.5, 0.25, 0.25}, 12);
  EXPECT_EQ(a.dataset_index.to_vector(), (std::vector<int64_t>{0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2, 0}));
  EXPECT_EQ(a.dataset_sample_index.to_vector(), (std::vector<int64_t>{0, 0, 0, 1, 2, 1, 1, 3, 4, 2, 2, 5}));
  EXPECT_EQ(a.dataset_index.type(), IndexType::i16);
  EXPECT_EQ(a.dataset_sample_index.type(), IndexType::i64);
  const BlendingIndices b = build_blending_indices(normalize_weights({0.3, 0.7}), 20);
  EXPECT_EQ(b.dataset_index.to_vector(),
            (std::vector<int64_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1}));
}

TEST(Blend, WeightedDataPathBuildsMegatronsMidLevelDatasets) {
  TempDir dir;
  GPTDataConfig config = base_config(dir);
  const std::string a = write_corpus(dir, "a", 0), b = write_corpus(dir, "b", 100000);
  config.data_path = {"0.3", a, "0.7", b};
  const auto source = build_gpt_dataset(config, Split::train, 20);
  const auto* blend = dynamic_cast<const BlendedDataset*>(source.get());
  ASSERT_NE(blend, nullptr);
  EXPECT_EQ(blend->size(), 20);  // ceil(20 * 0.3) + ceil(20 * 0.7)
  ASSERT_EQ(blend->datasets().size(), 2u);
  EXPECT_EQ(blend->datasets()[0]->identifiers()["num_samples"], 7);   // ceil(6 * 1.005)
  EXPECT_EQ(blend->datasets()[1]->identifiers()["num_samples"], 15);  // ceil(14 * 1.005)
  EXPECT_EQ(blend->dataset_index().to_vector(),
            (std::vector<int64_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1}));
  for (int64_t i = 0; i < blend->size(); ++i) {
    const auto& child = blend->datasets()[size_t(blend->dataset_index()[i])];
    EXPECT_EQ(blend->get(i), child->get(blend->dataset_sample_index()[i])) << i;
  }
  EXPECT_EQ(blend->identifiers()["weights"].dump(), "[0.3,0.7]");
  EXPECT_FALSE(blend->loaded_from_cache());
  // Megatron caches a blend only under --data-cache-path, named BlendedDataset.
  const std::string base = md5_hex(python_json_dumps(blend->identifiers())) + "-BlendedDataset-train-";
  EXPECT_TRUE(fs::is_regular_file(config.data_cache_path + "/" + base + "dataset_index.npy"));
  EXPECT_TRUE(fs::is_regular_file(config.data_cache_path + "/" + base + "dataset_sample_index.npy"));
  const auto again = build_gpt_dataset(config, Split::train, 20);
  EXPECT_TRUE(dynamic_cast<const BlendedDataset&>(*again).loaded_from_cache());
  EXPECT_EQ(again->get(19), source->get(19));

  config.data_path = {"1", a};  // one weighted prefix still blends
  const auto single = build_gpt_dataset(config, Split::train, 5);
  EXPECT_NE(dynamic_cast<const BlendedDataset*>(single.get()), nullptr);
}

// Weights 0.85 and 0.2 sum to 1.05; the builder's w / 1.05 gives 0.8095238095238094 and
// 0.19047619047619047, which sum to 0.9999999999999999, so Megatron's BlendedDataset, dividing by
// that sum again, blends by 0.8095238095238095 and 0.1904761904761905 (the values section 2.8
// records). 22 samples ask ceil(22 * w) = 18 and 5 of them (ceil(18 * 1.005) = 19 and
// ceil(5 * 1.005) = 6 built), a blend of 23. Worked by hand: with the shares about 17/21 and 4/21
// the greedy rule gives [0 1 0 0 0 0] then [1 0 0 0 0] three times (period 21/4 = 5.25), and at
// i = 21 the counts are 17 and 4: 21 * 0.8095238095238095 = 17.0 and 21 * 0.1904761904761905 =
// 4.0 exactly, a tie that goes to dataset 0 (then dataset 1 at i = 22). With the once-normalised
// weights 21 * 0.8095238095238094 = 16.999999999999996, so dataset 0's error is -3.6e-15 and
// dataset 1 would take sample 21: the order follows the last bit.
TEST(Blend, WeightsNormalisedTwiceAsMegatronDoes) {
  const double sum = 0.85 + 0.2;
  const std::vector<double> once = {0.85 / sum, 0.2 / sum};
  ASSERT_NE(once[0] + once[1], 1.0);
  const std::vector<double> twice = {once[0] / (once[0] + once[1]), once[1] / (once[0] + once[1])};
  EXPECT_EQ(once, (std::vector<double>{0.8095238095238094, 0.19047619047619047}));
  EXPECT_EQ(twice, (std::vector<double>{0.8095238095238095, 0.1904761904761905}));
  const std::vector<int64_t> expected = {0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1};
  ASSERT_EQ(reference_blend_order(twice, 23), expected);
  ASSERT_NE(reference_blend_order(once, 23)[21], expected[21]);

  TempDir dir;
  GPTDataConfig config = base_config(dir);
  const std::string a = write_corpus(dir, "a", 0), b = write_corpus(dir, "b", 100000);
  config.data_path = {"0.85", a, "0.2", b};
  const auto source = build_gpt_dataset(config, Split::train, 22);
  const auto& blend = dynamic_cast<const BlendedDataset&>(*source);
  EXPECT_EQ(blend.size(), 23);
  EXPECT_EQ(blend.datasets()[0]->identifiers()["num_samples"], 19);
  EXPECT_EQ(blend.datasets()[1]->identifiers()["num_samples"], 6);
  EXPECT_EQ(blend.weights(), twice);
  EXPECT_EQ(blend.dataset_index().to_vector(), expected);
  EXPECT_EQ(blend.dataset_sample_index().to_vector(),
            (std::vector<int64_t>{0, 0, 1, 2, 3, 4, 1, 5, 6, 7, 8, 2, 9, 10, 11, 12, 3, 13, 14, 15, 16, 17, 4}));
  // Sample 21 is corpus a's 18th (its tokens are below 100000), read through the blend.
  EXPECT_EQ(blend.get(21), blend.datasets()[0]->get(17));
  EXPECT_LT(blend.get(21)[0], 100000);
  // The cache description records the weights the blend used (Megatron's self.weights).
  EXPECT_EQ(blend.identifiers()["weights"].dump(), "[0.8095238095238095,0.1904761904761905]");
}

// Without weights Megatron blends one epoch of each prefix by the datasets' lengths, normalised
// to fractions. Corpus a holds 12 samples, b 4: weights 12/16 = 0.75 and 4/16 = 0.25, exact in
// binary, and 16 samples ask min(16, 12 + 4) = 16. By hand (x = max(i, 1); errors 0.75x - count_a,
// 0.25x - count_b): i=0: 0.75 vs 0.25 -> a; i=1: -0.25 vs 0.25 -> b; i=2: 0.5 vs -0.5 -> a;
// i=3: 0.25 vs -0.25 -> a; i=4: 0 vs 0, a tie -> a; then the same four-step period: a b a a
// from i = 4 on. Weighing by the raw lengths (12 and 4) would take every sample from a and run it
// dry at the 13th.
TEST(Blend, PrefixesWithoutWeightsBlendByNormalisedLength) {
  TempDir dir;
  GPTDataConfig config = base_config(dir);
  const std::string a = write_corpus(dir, "a", 0), b = write_corpus(dir, "b", 100000, 4);
  config.data_path = {a};
  EXPECT_NE(dynamic_cast<const GPTDataset*>(build_gpt_dataset(config, Split::train, 5).get()), nullptr);
  config.data_path = {a, b};
  const auto source = build_gpt_dataset(config, Split::train, 16);
  const auto& blend = dynamic_cast<const BlendedDataset&>(*source);
  ASSERT_EQ(blend.datasets()[0]->size(), 12);
  ASSERT_EQ(blend.datasets()[1]->size(), 4);
  EXPECT_TRUE(blend.datasets()[0]->identifiers()["num_samples"].is_null());  // one epoch
  EXPECT_EQ(blend.size(), 16);
  const std::vector<int64_t> expected = {0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0};
  EXPECT_EQ(reference_blend_order({0.75, 0.25}, 16), expected);
  EXPECT_EQ(blend.dataset_index().to_vector(), expected);
  EXPECT_EQ(blend.dataset_sample_index().to_vector(),
            (std::vector<int64_t>{0, 0, 1, 2, 3, 1, 4, 5, 6, 2, 7, 8, 9, 3, 10, 11}));
  EXPECT_EQ(blend.get(1), blend.datasets()[1]->get(0));
  EXPECT_GE(blend.get(1)[0], 100000);
  EXPECT_EQ(blend.identifiers()["weights"].dump(), "[0.75,0.25]");  // recorded as fractions
  // Asked for fewer than the datasets hold, the blend is that long, in the same order.
  EXPECT_EQ(build_gpt_dataset(config, Split::train, 6)->size(), 6);
  // Megatron's verified case (section 2.8): lengths 864/412/651 and size 500 take 224/107/169.
  const BlendingIndices known = build_blending_indices(normalize_weights({864, 412, 651}), 500);
  std::vector<int64_t> counts(3, 0);
  for (int64_t d : known.dataset_index.to_vector()) ++counts[size_t(d)];
  EXPECT_EQ(counts, (std::vector<int64_t>{224, 107, 169}));
}

TEST(Blend, OverAskedDatasetIsAnError) {
  TempDir dir;
  GPTDatasetConfig config;
  config.seq_length = 4;
  config.cache_path = dir / "cache";
  std::vector<std::unique_ptr<GPTDataset>> datasets;
  const auto data = open_indexed_sequences(write_corpus(dir, "a", 0));
  datasets.push_back(std::make_unique<GPTDataset>(data, SequenceRange{0, 10}, Split::train, 1, config));
  const std::string error = error_of([&] { BlendedDataset(std::move(datasets), {1.0}, 13, ""); });
  EXPECT_NE(error.find("for 13 samples but it has 12"), std::string::npos) << error;
}

TEST(Blend, PerSplitPathsUseWholeDatasets) {
  TempDir dir;
  GPTDataConfig config = base_config(dir);
  const std::string a = write_corpus(dir, "a", 0), b = write_corpus(dir, "b", 100000);
  config.train_data_path = {a};
  config.valid_data_path = {"0.5", a, "0.5", b};
  const auto train = build_gpt_dataset(config, Split::train, 5);
  const auto& gpt = dynamic_cast<const GPTDataset&>(*train);
  EXPECT_EQ(gpt.plan().tokens_per_epoch, 50);  // all ten documents
  EXPECT_TRUE(gpt.identifiers()["split"].is_null());
  EXPECT_TRUE(gpt.identifiers()["split_matrix"].is_null());
  const auto valid = build_gpt_dataset(config, Split::valid, 4);
  EXPECT_EQ(dynamic_cast<const BlendedDataset&>(*valid).datasets()[1]->identifiers()["index_split"], "valid");
  EXPECT_EQ(build_gpt_dataset(config, Split::test, 4), nullptr);
  // One prefix of a per-split list is a plain GPTDataset even with a weight (Megatron).
  config.test_data_path = {"1", b};
  EXPECT_NE(dynamic_cast<const GPTDataset*>(build_gpt_dataset(config, Split::test, 4).get()), nullptr);
  config.test_data_path.clear();

  config.data_path = {a};
  EXPECT_NE(error_of([&] { build_gpt_dataset(config, Split::train, 1); }).find("cannot be combined"),
            std::string::npos);
  config.mock_data = true;
  EXPECT_NE(error_of([&] { build_gpt_dataset(config, Split::train, 1); }).find("--mock-data cannot be combined"),
            std::string::npos);
  EXPECT_NE(error_of([&] { build_gpt_dataset(base_config(dir), Split::train, 1); }).find("no training data"),
            std::string::npos);
}
