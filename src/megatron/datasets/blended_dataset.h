#pragma once
// Blending and the top-level dataset builder (megatron-compat.md section 2.8; Megatron's
// BlendedDataset and BlendedMegatronDatasetBuilder).
//
// `--data-path 0.7 a 0.3 b`: the weights are normalised; each prefix's split is a GPTDataset
// asked for ceil(ceil(n*w) * (1 + surplus)) samples, and the BlendedDataset of size
// sum(ceil(n*w)) interleaves them greedily so every prefix stays closest to its share.
// `--data-path a b` (no weights): one epoch of each, blended by their lengths, min(n, total) long.
// `--train-data-path` etc. give each split its own blend of whole datasets.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/progress.h"
#include "megatron/datasets/gpt_dataset.h"

namespace megatron::datasets {

// A --data-path style list: "p1 p2 ..." (no weights) or "w1 p1 w2 p2 ...". An odd count, or
// any weight that is not a number, means the whole list is prefixes (Megatron's
// get_blend_from_list). Prefixes are stripped of surrounding whitespace.
struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;  // as given, not normalised
};
Blend parse_blend(const std::vector<std::string>& words);

// numpy's w / w.sum() in float64, the sum taken with numpy's pairwise summation so the
// normalised weights are bit-identical to Megatron's.
std::vector<double> normalize_weights(const std::vector<double>& weights);

// Megatron's build_blending_indices: for sample i the dataset d maximising
// w_d * max(i, 1) - count_d (ties to the lowest d) gets it; dataset_index[i] = d (int16) and
// dataset_sample_index[i] = count_d (int64), then count_d += 1.
struct BlendingIndices {
  IndexArray dataset_index;         // int16
  IndexArray dataset_sample_index;  // int64
};
BlendingIndices build_blending_indices(const std::vector<double>& weights, int64_t size,
                                       ProgressReporter* progress = nullptr);

class BlendedDataset final : public SampleSource {
 public:
  // `weights`: the builder's normalised weights, or each dataset's length when the blend gave
  // none. Like Megatron's BlendedDataset, it normalises them (again) itself and blends by, and
  // records, the result: a second normalisation can change the last bit, and the blend order
  // with it. Throws if a dataset would be asked for more samples than it has. The indices are
  // cached only in an explicit cache_path (--data-cache-path), as in Megatron.
  BlendedDataset(std::vector<std::unique_ptr<GPTDataset>> datasets, const std::vector<double>& weights, int64_t size,
                 const std::string& cache_path);

  int64_t size() const override { return dataset_index_.size(); }
  int64_t sample_length() const override { return datasets_[0]->sample_length(); }
  void read(int64_t index, int32_t* out) const override;

  const nlohmann::ordered_json& identifiers() const { return identifiers_; }
  const std::vector<std::unique_ptr<GPTDataset>>& datasets() const { return datasets_; }
  const IndexArray& dataset_index() const { return dataset_index_; }
  const IndexArray& dataset_sample_index() const { return dataset_sample_index_; }
  const std::vector<double>& weights() const { return weights_; }  // as normalised here
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  std::string check_indices(int64_t size) const;

  std::vector<std::unique_ptr<GPTDataset>> datasets_;
  std::vector<double> weights_;
  nlohmann::ordered_json identifiers_;
  IndexArray dataset_index_, dataset_sample_index_;
  bool loaded_from_cache_ = false;
};

// Everything that chooses a run's datasets: Megatron's data flags.
struct GPTDataConfig {
  std::vector<std::string> data_path;        // --data-path
  std::vector<std::string> train_data_path;  // --train-data-path
  std::vector<std::string> valid_data_path;  // --valid-data-path
  std::vector<std::string> test_data_path;   // --test-data-path
  bool mock_data = false;                    // --mock-data (split forced to "1,1,1")
  std::string split = "969, 30, 1";          // --split, for --data-path
  std::string data_cache_path;               // --data-cache-path ("": Megatron's default)
  double mid_level_dataset_surplus = 0.005;  // --mid-level-dataset-surplus
  int64_t seq_length = 0;                    // --seq-length
  int64_t seed = 1234;                       // --seed
  nlohmann::ordered_json tokenizer;          // the tokenizer's identifiers (GPTDatasetConfig)
  int64_t vocab_size = 0;                    // mock documents: ids mod this
  int32_t eod = 0;                           // mock documents: the last id
};

// The dataset of `split` asked for `num_samples` samples (training.py's count for that split),
// or nullptr when that split is not built: zero weight in --split, or no per-split path.
// The result is a GPTDataset for one prefix without a weight and a BlendedDataset otherwise.
std::unique_ptr<SampleSource> build_gpt_dataset(const GPTDataConfig& config, Split split, int64_t num_samples);

}  // namespace megatron::datasets
