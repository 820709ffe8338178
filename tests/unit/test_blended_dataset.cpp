// Blending against megatron-compat.md section 2.8 (known answers produced by Megatron-LM) and
// the builder's routing of --data-path, per-split paths and mock data.
#include <gtest/gtest.h>

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

// Ten one-sequence documents; document i token k = base + i*100 + k.
std::string write_corpus(const TempDir& dir, const std::string& name, int32_t base) {
  const std::string prefix = dir / name;
  IndexedDatasetBuilder builder(prefix, IndexDType::i32);
  const int lengths[10] = {5, 3, 8, 2, 7, 4, 6, 9, 1, 5};
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> ids;
    for (int k = 0; k < lengths[i]; ++k) ids.push_back(base + i * 100 + k);
    builder.add_document(ids);
  }
  builder.finalize();
  return prefix;
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

TEST(Blend, PrefixesWithoutWeightsBlendByLength) {
  TempDir dir;
  GPTDataConfig config = base_config(dir);
  const std::string a = write_corpus(dir, "a", 0), b = write_corpus(dir, "b", 100000);
  config.data_path = {a};
  EXPECT_NE(dynamic_cast<const GPTDataset*>(build_gpt_dataset(config, Split::train, 5).get()), nullptr);
  config.data_path = {a, b};
  const auto source = build_gpt_dataset(config, Split::train, 100);
  const auto& blend = dynamic_cast<const BlendedDataset&>(*source);
  // One epoch each: (50 - 1) / 4 = 12 samples; the blend is min(100, 24) long.
  EXPECT_EQ(blend.datasets()[0]->size(), 12);
  EXPECT_EQ(blend.size(), 24);
  EXPECT_EQ(blend.identifiers()["weights"].dump(), "[12,12]");
  EXPECT_TRUE(blend.datasets()[0]->identifiers()["num_samples"].is_null());
}

TEST(Blend, OverAskedDatasetIsAnError) {
  TempDir dir;
  GPTDatasetConfig config;
  config.seq_length = 4;
  config.cache_path = dir / "cache";
  std::vector<std::unique_ptr<GPTDataset>> datasets;
  const auto data = open_indexed_sequences(write_corpus(dir, "a", 0));
  datasets.push_back(std::make_unique<GPTDataset>(data, SequenceRange{0, 10}, Split::train, 1, config));
  const std::string error = error_of([&] { BlendedDataset(std::move(datasets), {1.0}, false, 13, ""); });
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

  config.data_path = {a};
  EXPECT_NE(error_of([&] { build_gpt_dataset(config, Split::train, 1); }).find("cannot be combined"),
            std::string::npos);
  config.mock_data = true;
  EXPECT_NE(error_of([&] { build_gpt_dataset(config, Split::train, 1); }).find("--mock-data cannot be combined"),
            std::string::npos);
  EXPECT_NE(error_of([&] { build_gpt_dataset(base_config(dir), Split::train, 1); }).find("no training data"),
            std::string::npos);
}
