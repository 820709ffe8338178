#include "megatron/datasets/gpt_dataset.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/datasets/dataset_cache.h"
#include "megatron/datasets/numpy_random.h"

namespace megatron::datasets {

namespace {

bool is_split_char(char c) { return (c >= '0' && c <= '9') || c == '.'; }

// The numbers of a split string: each maximal run of [.0-9], as Megatron's regex finds them.
std::vector<double> split_weights(const std::string& split) {
  std::vector<double> weights;
  size_t pos = 0;
  while (pos < split.size()) {
    if (!is_split_char(split[pos])) {
      ++pos;
      continue;
    }
    size_t end = pos;
    while (end < split.size() && is_split_char(split[end])) ++end;
    const std::string word = split.substr(pos, end - pos);
    char* parsed_end = nullptr;
    const double value = std::strtod(word.c_str(), &parsed_end);
    MEGATRON_CHECK(parsed_end == word.c_str() + word.size(),
                   "--split '" << split << "': '" << word << "' is not a number; write weights like \"969,30,1\"");
    weights.push_back(value);
    pos = end;
  }
  return weights;
}

}  // namespace

const char* split_name(Split split) {
  switch (split) {
    case Split::train:
      return "train";
    case Split::valid:
      return "valid";
    case Split::test:
      return "test";
  }
  return "unknown";
}

SplitMatrix parse_split(const std::string& split) {
  std::vector<double> weights = split_weights(split);
  MEGATRON_CHECK(!weights.empty() && weights.size() <= 3,
                 "--split '" << split << "' has " << weights.size()
                             << " weights; give one to three (train, valid, test), e.g. \"969,30,1\"");
  weights.resize(3, 0.0);
  double sum = 0.0;  // numpy's sum of fewer than 8 values is this left-to-right loop
  for (double w : weights) sum += w;
  MEGATRON_CHECK(sum > 0.0, "--split '" << split << "' weights sum to 0; at least one split needs a positive weight");
  SplitMatrix matrix;
  double lo = 0.0;
  for (size_t k = 0; k < 3; ++k) {
    const double hi = lo + weights[k] / sum;
    if (hi > lo) matrix[k] = std::make_pair(lo, hi);
    lo = hi;
  }
  return matrix;
}

nlohmann::ordered_json split_matrix_json(const SplitMatrix& matrix) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t k = 0; k < matrix.size(); ++k) {
    if (!matrix[k]) {
      out.push_back(nullptr);
      continue;
    }
    nlohmann::ordered_json bounds = nlohmann::ordered_json::array();
    if (k == 0) {
      bounds.push_back(0);  // Python's int 0 that the running sum starts from
    } else {
      bounds.push_back(matrix[k]->first);
    }
    bounds.push_back(matrix[k]->second);
    out.push_back(bounds);
  }
  return out;
}

std::optional<SequenceRange> split_range(const SplitMatrix& matrix, Split split, int64_t num_sequences) {
  MEGATRON_CHECK(num_sequences >= 0, "negative sequence count " << num_sequences);
  const auto& bookends = matrix[size_t(split)];
  if (!bookends) return std::nullopt;
  // Python's round() on the float64 product: half to even, which nearbyint does by default.
  const double n = double(num_sequences);
  return SequenceRange{int64_t(std::nearbyint(bookends->first * n)), int64_t(std::nearbyint(bookends->second * n))};
}

std::vector<int32_t> SampleSource::get(int64_t index) const {
  std::vector<int32_t> out(static_cast<size_t>(sample_length()));
  read(index, out.data());
  return out;
}

// ---- sequence sources -----------------------------------------------------------------------

namespace {

class IndexedSequences final : public SequenceSource {
 public:
  explicit IndexedSequences(IndexedDataset data) : data_(std::move(data)) {}
  int64_t num_sequences() const override { return data_.num_sequences(); }
  int32_t sequence_length(int64_t i) const override { return data_.sequence_length(i); }
  void read(int64_t i, int64_t offset, int64_t length, int32_t* out) const override {
    data_.read(i, offset, length, out);
  }
  std::optional<std::string> path() const override { return data_.prefix(); }
  std::string dataset_class() const override { return "GPTDataset"; }

 private:
  IndexedDataset data_;
};

class MockSequences final : public SequenceSource {
 public:
  MockSequences(int64_t vocab_size, int32_t eod)
      : lengths_(NumpyGenerator(0).integers_i32(1, 4096, kMockNumDocuments)), vocab_size_(vocab_size), eod_(eod) {
    MEGATRON_CHECK(vocab_size >= 1, "mock data needs a vocabulary of at least one id, got " << vocab_size);
  }
  int64_t num_sequences() const override { return int64_t(lengths_.size()); }
  int32_t sequence_length(int64_t i) const override { return lengths_[size_t(i)]; }
  void read(int64_t i, int64_t offset, int64_t length, int32_t* out) const override {
    const int64_t last = lengths_[size_t(i)] - 1;
    for (int64_t k = offset; k < offset + length; ++k) {
      out[k - offset] = k == last ? eod_ : int32_t((k + 1) % vocab_size_);
    }
  }
  std::optional<std::string> path() const override { return std::nullopt; }
  std::string dataset_class() const override { return "MockGPTDataset"; }

 private:
  std::vector<int32_t> lengths_;
  int64_t vocab_size_;
  int32_t eod_;
};

}  // namespace

std::shared_ptr<const SequenceSource> open_indexed_sequences(const std::string& prefix) {
  return std::make_shared<IndexedSequences>(IndexedDataset::open(prefix));
}

std::shared_ptr<const SequenceSource> mock_sequences(int64_t vocab_size, int32_t eod) {
  return std::make_shared<MockSequences>(vocab_size, eod);
}

// ---- GPTDataset -----------------------------------------------------------------------------

GPTDataset::GPTDataset(std::shared_ptr<const SequenceSource> data, SequenceRange range, Split split,
                       std::optional<int64_t> num_samples, const GPTDatasetConfig& config)
    : data_(std::move(data)), range_(range), seq_length_(config.seq_length), seed_(config.seed) {
  MEGATRON_CHECK(data_ != nullptr, "GPTDataset needs a sequence source");
  const std::optional<std::string> prefix = data_->path();
  const std::string what = std::string("split ") + split_name(split) + " of " + prefix.value_or("the mock data");
  MEGATRON_CHECK(range.begin >= 0 && range.begin <= range.end && range.end <= data_->num_sequences(),
                 what << ": sequence range [" << range.begin << ", " << range.end << ") lies outside the "
                      << data_->num_sequences() << " sequences");
  lengths_.reserve(size_t(range.end - range.begin));
  int64_t tokens = 0;
  for (int64_t i = range.begin; i < range.end; ++i) {
    lengths_.push_back(data_->sequence_length(i));
    tokens += lengths_.back();
  }
  documents_ = DocumentRange{range.begin, lengths_};
  plan_ = plan_epochs(tokens, num_samples, seq_length_, what);

  const std::string dataset_class = data_->dataset_class();
  identifiers_["class"] = dataset_class;
  identifiers_["dataset_path"] = prefix ? nlohmann::ordered_json(*prefix) : nlohmann::ordered_json(nullptr);
  identifiers_["num_samples"] = num_samples ? nlohmann::ordered_json(*num_samples) : nlohmann::ordered_json(nullptr);
  identifiers_["index_split"] = split_name(split);
  identifiers_["random_seed"] = config.seed;
  identifiers_["sequence_length"] = config.seq_length;
  identifiers_["split"] = config.split ? nlohmann::ordered_json(*config.split) : nlohmann::ordered_json(nullptr);
  identifiers_["split_matrix"] = config.split ? split_matrix_json(parse_split(*config.split)) : nullptr;
  identifiers_["tokenizer"] = config.tokenizer;

  std::string directory = config.cache_path;
  if (directory.empty() && prefix) directory = default_cache_directory(*prefix, dataset_class);
  std::optional<IndexCache> cache;
  if (!directory.empty()) cache.emplace(directory, dataset_class, split_name(split), python_json_dumps(identifiers_));

  const auto start = std::chrono::steady_clock::now();
  if (cache) {
    if (auto arrays = cache->load({"document_index", "sample_index", "shuffle_index"})) {
      document_index_ = (*arrays)[0];
      sample_index_ = (*arrays)[1];
      shuffle_index_ = (*arrays)[2];
      const std::string problem = check_indices();
      loaded_from_cache_ = problem.empty();
      if (!loaded_from_cache_) cache->report_invalid(problem);
    }
  }
  if (!loaded_from_cache_) {
    build(what);
    if (cache) {
      cache->save(
          {{"document_index", &document_index_}, {"sample_index", &sample_index_}, {"shuffle_index", &shuffle_index_}});
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ostringstream where;
  if (loaded_from_cache_) {
    where << "indices loaded from " << cache->path("*");
  } else {
    where << "indices built in " << std::fixed << std::setprecision(3) << seconds << " s";
  }
  LOG_INFO("> " << dataset_class << " " << what << ": " << plan_.total_samples << " samples of " << seq_length_
                << " tokens over " << plan_.num_epochs << " epoch(s) of " << plan_.tokens_per_epoch << " tokens"
                << (plan_.separate_final_epoch ? " (final epoch shuffled separately)" : "") << "; " << where.str());
}

void GPTDataset::build(const std::string& what) {
  const int64_t epoch_documents = plan_.num_epochs * documents_.count();
  ProgressReporter progress("GPTDataset " + what + " indices", epoch_documents + 2 * plan_.total_samples,
                            "index entries");
  NumpyRandomState rng(seed_);  // one stream: document index first, then shuffle index
  document_index_ = build_document_index(documents_, plan_, rng, &progress);
  sample_index_ = build_sample_index(documents_, document_index_, seq_length_, plan_, &progress);
  shuffle_index_ = build_shuffle_index(plan_, rng, &progress);
  progress.finish();
}

std::string GPTDataset::check_indices() const {
  std::ostringstream why;
  const int64_t positions = plan_.num_epochs * documents_.count();
  if (document_index_.type() != IndexType::i32 || document_index_.columns() != 1 ||
      document_index_.rows() != positions) {
    why << "document_index should be " << positions << " int32 values";
    return why.str();
  }
  for (int64_t i = 0; i < positions; ++i) {
    const int64_t document = document_index_[i];
    if (document < range_.begin || document >= range_.end) {
      why << "document_index[" << i << "] = " << document << " lies outside [" << range_.begin << ", " << range_.end
          << ")";
      return why.str();
    }
  }
  const int64_t total = plan_.total_samples;
  if (sample_index_.type() == IndexType::i16 || sample_index_.type() == IndexType::u32 ||
      sample_index_.columns() != 2 || sample_index_.rows() != total + 1) {
    why << "sample_index should be (" << total + 1 << ", 2) int32 or int64 values";
    return why.str();
  }
  int64_t previous_position = 0, previous_offset = -1;
  for (int64_t row = 0; row <= total; ++row) {
    const int64_t position = sample_index_.at(row, 0), offset = sample_index_.at(row, 1);
    // Row 0 is (0, 0) even when the first document is empty; later rows lie inside a document.
    const bool inside = row == 0 ? position == 0 && offset == 0
                                 : position >= 0 && position < positions && offset >= 0 &&
                                       offset < documents_.length(document_index_[position]);
    const bool ascending = position > previous_position || (position == previous_position && offset > previous_offset);
    if (!inside || !ascending) {
      why << "sample_index row " << row << " = (" << position << ", " << offset << ") is not a valid next boundary";
      return why.str();
    }
    previous_position = position;
    previous_offset = offset;
  }
  if ((shuffle_index_.type() != IndexType::u32 && shuffle_index_.type() != IndexType::i64) ||
      shuffle_index_.columns() != 1 || shuffle_index_.rows() != total) {
    why << "shuffle_index should be " << total << " uint32 or int64 values";
    return why.str();
  }
  // A permutation of [0, first) followed by one of [first, total).
  const int64_t first = plan_.separate_final_epoch ? plan_.samples_before_final_epoch : total;
  std::vector<bool> seen(static_cast<size_t>(total), false);
  for (int64_t i = 0; i < total; ++i) {
    const int64_t sample = shuffle_index_[i];
    const bool in_part = i < first ? (sample >= 0 && sample < first) : (sample >= first && sample < total);
    if (!in_part || seen[size_t(sample)]) {
      why << "shuffle_index[" << i << "] = " << sample << " breaks the permutation";
      return why.str();
    }
    seen[size_t(sample)] = true;
  }
  return {};
}

void GPTDataset::read(int64_t index, int32_t* out) const {
  MEGATRON_CHECK(index >= 0 && index < size(), "sample " << index << " is out of range [0, " << size() << ")");
  const int64_t sample = shuffle_index_[index];
  const int64_t first = sample_index_.at(sample, 0), first_offset = sample_index_.at(sample, 1);
  const int64_t last = sample_index_.at(sample + 1, 0), last_offset = sample_index_.at(sample + 1, 1);
  // From (first, first_offset) through (last, last_offset) inclusive: the last token is the
  // first of the next sample.
  int64_t filled = 0;
  for (int64_t position = first; position <= last; ++position) {
    const int64_t document = document_index_[position];
    const int64_t offset = position == first ? first_offset : 0;
    const int64_t end = position == last ? last_offset + 1 : documents_.length(document);
    MEGATRON_CHECK(filled + end - offset <= sample_length(),
                   "sample " << index << " spans more than " << sample_length() << " tokens; the indices are damaged");
    data_->read(document, offset, end - offset, out + filled);
    filled += end - offset;
  }
  MEGATRON_CHECK(filled == sample_length(),
                 "sample " << index << " holds " << filled << " tokens, not " << sample_length());
}

// ---- batches --------------------------------------------------------------------------------

Batch make_batch(const SampleSource& source, std::span<const int64_t> sample_indices, const BatchOptions& options) {
  MEGATRON_CHECK(!sample_indices.empty(), "make_batch needs at least one sample index");
  const int64_t b = int64_t(sample_indices.size());
  const int64_t s = source.sample_length() - 1;
  MEGATRON_CHECK(s >= 1, "samples of " << s + 1 << " tokens are too short; a training sample needs at least 2");
  const Shape shape{b, s};
  Batch batch;
  batch.tokens = Tensor::empty(shape, DType::i32);
  batch.labels = Tensor::empty(shape, DType::i32);
  batch.loss_mask = Tensor::empty(shape, DType::f32);
  batch.position_ids = Tensor::empty(shape, DType::i32);
  if (options.reset_attention_mask) batch.segment_ids = Tensor::empty(shape, DType::i32);

  std::vector<int32_t> sample(static_cast<size_t>(s + 1));
  for (int64_t row = 0; row < b; ++row) {
    source.read(sample_indices[size_t(row)], sample.data());
    int32_t* tokens = batch.tokens.data<int32_t>() + row * s;
    int32_t* labels = batch.labels.data<int32_t>() + row * s;
    float* mask = batch.loss_mask.data<float>() + row * s;
    int32_t* positions = batch.position_ids.data<int32_t>() + row * s;
    int32_t* segments = options.reset_attention_mask ? batch.segment_ids.data<int32_t>() + row * s : nullptr;
    int64_t document_start = 0;
    int32_t segment = 0;
    for (int64_t t = 0; t < s; ++t) {
      const int32_t input = sample[size_t(t)], label = sample[size_t(t) + 1];
      const bool eod = input == options.eod;
      mask[t] = (options.eod_mask_loss && eod) || label == options.pad ? 0.0f : 1.0f;
      positions[t] = int32_t(options.reset_position_ids ? t - document_start : t);
      if (segments) segments[t] = segment;
      if (eod) {  // the next position starts a new document
        document_start = t + 1;
        ++segment;
      }
      // Megatron maps pad ids to 0 so the embedding can look them up (their loss is masked).
      tokens[t] = input == options.pad ? 0 : input;
      labels[t] = label == options.pad ? 0 : label;
    }
  }
  return batch;
}

// ---- transitional entry points ----------------------------------------------------------------

MockGPTDataset::MockGPTDataset(int64_t vocab_size, int64_t seq_length, int64_t seed, int64_t num_samples, Split split) {
  MEGATRON_CHECK(vocab_size >= 2, "mock data needs --vocab-size of at least 2 (one id plus EOD), got " << vocab_size);
  const std::optional<SequenceRange> range = split_range(parse_split("1,1,1"), split, kMockNumDocuments);
  GPTDatasetConfig config;
  config.seq_length = seq_length;
  config.seed = seed;
  config.split = "1,1,1";
  dataset_ = std::make_unique<GPTDataset>(mock_sequences(vocab_size, int32_t(vocab_size - 1)), *range, split,
                                          num_samples, config);
}

Batch make_batch(const SampleSource& source, const std::vector<int64_t>& sample_indices, int32_t eod,
                 bool eod_mask_loss) {
  BatchOptions options;
  options.eod = eod;
  options.eod_mask_loss = eod_mask_loss;
  return make_batch(source, std::span<const int64_t>(sample_indices), options);
}

}  // namespace megatron::datasets
