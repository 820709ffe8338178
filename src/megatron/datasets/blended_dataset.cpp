#include "megatron/datasets/blended_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/datasets/dataset_cache.h"

namespace megatron::datasets {

namespace {

std::string strip(const std::string& text) {
  const char* space = " \t\n\r\f\v";
  const size_t begin = text.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(space) - begin + 1);
}

// Python's float(text) for the forms a weight takes; nullopt when it is not a number.
std::optional<double> python_float(const std::string& text) {
  const std::string word = strip(text);
  // strtod also reads hexadecimal, which Python's float() rejects.
  if (word.empty() || word.find_first_of("xX") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(word.c_str(), &end);
  if (end != word.c_str() + word.size()) return std::nullopt;
  return value;
}

// numpy's pairwise summation of float64 (the add.reduce inner loop): blocks of fewer than 8
// values are summed left to right, up to 128 in 8 interleaved accumulators, larger ones split
// in two at a multiple of 8.
double numpy_pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += a[i];
    return sum;
  }
  if (n <= 128) {
    double r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - n % 8; i += 8) {
      for (size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += a[i];
    return sum;
  }
  size_t half = n / 2;
  half -= half % 8;
  return numpy_pairwise_sum(a, half) + numpy_pairwise_sum(a + half, n - half);
}

}  // namespace

Blend parse_blend(const std::vector<std::string>& words) {
  Blend blend;
  if (words.size() % 2 == 0) {
    std::vector<double> weights;
    for (size_t i = 0; i < words.size(); i += 2) {
      const std::optional<double> weight = python_float(words[i]);
      if (!weight) {
        weights.clear();
        break;
      }
      weights.push_back(*weight);
      blend.prefixes.push_back(strip(words[i + 1]));
    }
    if (!weights.empty()) {
      blend.weights = std::move(weights);
      return blend;
    }
    blend.prefixes.clear();
  }
  for (const std::string& word : words) blend.prefixes.push_back(strip(word));
  return blend;
}

std::vector<double> normalize_weights(const std::vector<double>& weights) {
  for (double w : weights) {
    MEGATRON_CHECK(
        std::isfinite(w) && w >= 0.0,
        "blend weight " << w << " must be a finite number >= 0; write --data-path 0.7 PREFIX_A 0.3 PREFIX_B");
  }
  const double sum = numpy_pairwise_sum(weights.data(), weights.size());
  MEGATRON_CHECK(sum > 0.0, "the blend weights sum to " << sum << "; give at least one positive weight");
  std::vector<double> out;
  for (double w : weights) out.push_back(w / sum);
  return out;
}

BlendingIndices build_blending_indices(const std::vector<double>& weights, int64_t size, ProgressReporter* progress) {
  MEGATRON_CHECK(!weights.empty() && weights.size() <= 32767,
                 "a blend needs 1 to 32767 datasets (the int16 dataset index), got " << weights.size());
  MEGATRON_CHECK(size >= 0, "blend size " << size << " must be non-negative");
  std::vector<int16_t> dataset_index(static_cast<size_t>(size));
  std::vector<int64_t> dataset_sample_index(static_cast<size_t>(size));
  std::vector<int64_t> counts(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    const double x = std::max(double(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * x - double(counts[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * x - double(counts[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset_index[size_t(i)] = int16_t(best);
    dataset_sample_index[size_t(i)] = counts[best]++;
    // Every 2^20 samples: the clock is read rarely enough to cost nothing.
    if (progress && ((i + 1) & ((int64_t(1) << 20) - 1)) == 0) progress->advance(int64_t(1) << 20);
  }
  return {IndexArray(std::move(dataset_index)), IndexArray(std::move(dataset_sample_index))};
}

// ---- BlendedDataset -------------------------------------------------------------------------

BlendedDataset::BlendedDataset(std::vector<std::unique_ptr<GPTDataset>> datasets, const std::vector<double>& weights,
                               int64_t size, const std::string& cache_path)
    : datasets_(std::move(datasets)), weights_(normalize_weights(weights)) {
  MEGATRON_CHECK(!datasets_.empty() && datasets_.size() == weights_.size(),
                 "BlendedDataset: " << datasets_.size() << " datasets but " << weights_.size() << " weights");
  for (const auto& dataset : datasets_) {
    MEGATRON_CHECK(dataset->sample_length() == datasets_[0]->sample_length(),
                   "BlendedDataset: the blended datasets have different sequence lengths");
  }
  const std::string split = datasets_[0]->identifiers()["index_split"].get<std::string>();
  identifiers_["class"] = "BlendedDataset";
  identifiers_["datasets"] = nlohmann::ordered_json::array();
  for (const auto& dataset : datasets_) identifiers_["datasets"].push_back(dataset->identifiers());
  identifiers_["split"] = split;
  identifiers_["weights"] = weights_;
  identifiers_["size"] = size;

  std::optional<IndexCache> cache;
  if (!cache_path.empty()) cache.emplace(cache_path, "BlendedDataset", split, python_json_dumps(identifiers_));
  if (cache) {
    if (auto arrays = cache->load({"dataset_index", "dataset_sample_index"})) {
      dataset_index_ = (*arrays)[0];
      dataset_sample_index_ = (*arrays)[1];
      const std::string problem = check_indices(size);
      loaded_from_cache_ = problem.empty();
      if (!loaded_from_cache_) cache->report_invalid(problem);
    }
  }
  if (!loaded_from_cache_) {
    ProgressReporter progress("BlendedDataset " + split + " indices", size, "samples");
    BlendingIndices indices = build_blending_indices(weights_, size, &progress);
    progress.finish();
    dataset_index_ = std::move(indices.dataset_index);
    dataset_sample_index_ = std::move(indices.dataset_sample_index);
    // Megatron's IndexError: a dataset asked for more samples than it holds.
    std::vector<int64_t> counts(datasets_.size(), 0);
    for (int64_t i = 0; i < size; ++i) ++counts[size_t(dataset_index_[i])];
    for (size_t d = 0; d < datasets_.size(); ++d) {
      MEGATRON_CHECK(counts[d] <= datasets_[d]->size(),
                     "the " << split << " blend asks dataset " << d << " ("
                            << datasets_[d]->identifiers()["dataset_path"].dump() << ") for " << counts[d]
                            << " samples but it has " << datasets_[d]->size()
                            << "; give it a smaller weight or ask for fewer samples");
    }
    if (cache) cache->save({{"dataset_index", &dataset_index_}, {"dataset_sample_index", &dataset_sample_index_}});
  }
  LOG_INFO("> BlendedDataset " << split << ": " << size << " samples from " << datasets_.size() << " datasets"
                               << (loaded_from_cache_ ? "; indices loaded from " + cache->path("*") : ""));
}

std::string BlendedDataset::check_indices(int64_t size) const {
  std::ostringstream why;
  if (dataset_index_.type() != IndexType::i16 || dataset_index_.columns() != 1 || dataset_index_.rows() != size ||
      dataset_sample_index_.type() != IndexType::i64 || dataset_sample_index_.columns() != 1 ||
      dataset_sample_index_.rows() != size) {
    why << "expected " << size << " int16 dataset ids and " << size << " int64 sample ids";
    return why.str();
  }
  // The greedy construction hands each dataset its samples in order 0, 1, 2, ...
  std::vector<int64_t> counts(datasets_.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    const int64_t d = dataset_index_[i];
    if (d < 0 || d >= int64_t(datasets_.size()) || dataset_sample_index_[i] != counts[size_t(d)] ||
        counts[size_t(d)] >= datasets_[size_t(d)]->size()) {
      why << "entry " << i << " = (dataset " << d << ", sample " << dataset_sample_index_[i] << ") is inconsistent";
      return why.str();
    }
    ++counts[size_t(d)];
  }
  return {};
}

void BlendedDataset::read(int64_t index, int32_t* out) const {
  MEGATRON_CHECK(index >= 0 && index < size(), "sample " << index << " is out of range [0, " << size() << ")");
  datasets_[size_t(dataset_index_[index])]->read(dataset_sample_index_[index], out);
}

// ---- the builder ----------------------------------------------------------------------------

namespace {

// Builds one split from a blend; `range_of` gives the split's sequences of a prefix's data;
// `whole_datasets`: a per-split path list (--train-data-path etc.).
std::unique_ptr<SampleSource> build_from_blend(const Blend& blend, const GPTDataConfig& config,
                                               const GPTDatasetConfig& dataset_config, Split split, int64_t num_samples,
                                               const std::function<std::optional<SequenceRange>(int64_t)>& range_of,
                                               bool whole_datasets) {
  MEGATRON_CHECK(!blend.prefixes.empty(), "the data path list for split " << split_name(split) << " is empty");
  auto open = [&](const std::string& prefix, std::optional<int64_t> samples) {
    std::shared_ptr<const SequenceSource> data = open_indexed_sequences(prefix);
    const SequenceRange range = *range_of(data->num_sequences());
    MEGATRON_CHECK(range.end > range.begin, "split " << split_name(split) << " of " << prefix << " gets no sequences: ["
                                                     << range.begin << ", " << range.end << ") of "
                                                     << data->num_sequences() << "; use more data or change --split");
    return std::make_unique<GPTDataset>(std::move(data), range, split, samples, dataset_config);
  };
  // Megatron builds one prefix without a weight as a plain GPTDataset; under a per-split path
  // (`whole_datasets`) one prefix is plain even with a weight.
  if (blend.prefixes.size() == 1 && (!blend.weights || whole_datasets)) return open(blend.prefixes[0], num_samples);

  std::vector<std::unique_ptr<GPTDataset>> datasets;
  if (blend.weights) {
    const std::vector<double> weights = normalize_weights(*blend.weights);
    int64_t size = 0;
    for (size_t d = 0; d < weights.size(); ++d) {
      // Each prefix's share, and a small surplus so the blend never runs a dataset dry.
      const auto target = int64_t(std::ceil(double(num_samples) * weights[d]));
      const auto buffered = int64_t(std::ceil(double(target) * (1.0 + config.mid_level_dataset_surplus)));
      datasets.push_back(open(blend.prefixes[d], buffered));
      size += target;
    }
    return std::make_unique<BlendedDataset>(std::move(datasets), weights, size, config.data_cache_path);
  }
  // Prefixes without weights: one epoch each, blended in proportion to their lengths (which the
  // BlendedDataset normalises into weights).
  std::vector<double> lengths;
  int64_t total = 0;
  for (const std::string& prefix : blend.prefixes) {
    datasets.push_back(open(prefix, std::nullopt));
    lengths.push_back(double(datasets.back()->size()));
    total += datasets.back()->size();
  }
  return std::make_unique<BlendedDataset>(std::move(datasets), lengths, std::min(num_samples, total),
                                          config.data_cache_path);
}

}  // namespace

std::unique_ptr<SampleSource> build_gpt_dataset(const GPTDataConfig& config, Split split, int64_t num_samples) {
  MEGATRON_CHECK(num_samples >= 0, "requested sample count " << num_samples << " for split " << split_name(split)
                                                             << " must be non-negative");
  const std::vector<std::string>* per_split[3] = {&config.train_data_path, &config.valid_data_path,
                                                  &config.test_data_path};
  const bool has_per_split = !per_split[0]->empty() || !per_split[1]->empty() || !per_split[2]->empty();
  const bool has_blend = !config.data_path.empty();
  GPTDatasetConfig dataset_config;
  dataset_config.seq_length = config.seq_length;
  dataset_config.seed = config.seed;
  dataset_config.cache_path = config.data_cache_path;
  dataset_config.tokenizer = config.tokenizer;

  if (config.mock_data) {
    MEGATRON_CHECK(!has_blend && !has_per_split,
                   "--mock-data cannot be combined with --data-path or --train/valid/test-data-path; drop one");
    dataset_config.split = "1,1,1";  // Megatron ignores --split for mock data
    const std::optional<SequenceRange> range = split_range(parse_split("1,1,1"), split, kMockNumDocuments);
    return std::make_unique<GPTDataset>(mock_sequences(config.vocab_size, config.eod), *range, split, num_samples,
                                        dataset_config);
  }
  MEGATRON_CHECK(!(has_blend && has_per_split),
                 "--data-path cannot be combined with --train-data-path/--valid-data-path/--test-data-path; use "
                 "either one blend split by --split or one path list per split");
  MEGATRON_CHECK(has_blend || has_per_split,
                 "no training data: give --data-path PREFIX (PREFIX.bin/.idx), per-split paths or --mock-data");
  if (has_blend) {
    const SplitMatrix matrix = parse_split(config.split);
    if (!matrix[size_t(split)]) return nullptr;
    dataset_config.split = config.split;
    const auto range_of = [&](int64_t n) { return split_range(matrix, split, n); };
    return build_from_blend(parse_blend(config.data_path), config, dataset_config, split, num_samples, range_of, false);
  }
  const std::vector<std::string>& paths = *per_split[size_t(split)];
  if (paths.empty()) return nullptr;
  // Each split's own datasets are used whole; the description records no split.
  const auto whole = [](int64_t n) { return std::optional<SequenceRange>(SequenceRange{0, n}); };
  return build_from_blend(parse_blend(paths), config, dataset_config, split, num_samples, whole, true);
}

// ---- transitional entry point (declared in gpt_dataset.h) -----------------------------------

std::unique_ptr<SampleSource> build_split_dataset(const std::vector<std::string>& data_path, const std::string& split,
                                                  int split_index, int64_t seq_length, int64_t seed,
                                                  int64_t num_samples) {
  MEGATRON_CHECK(split_index >= 0 && split_index <= 2,
                 "split index " << split_index << " must be 0 (train), 1 (valid) or 2 (test)");
  GPTDataConfig config;
  config.data_path = data_path;
  config.split = split;
  config.seq_length = seq_length;
  config.seed = seed;
  return build_gpt_dataset(config, Split(split_index), num_samples);
}

}  // namespace megatron::datasets
