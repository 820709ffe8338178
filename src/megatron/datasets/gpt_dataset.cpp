#include "megatron/datasets/gpt_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "megatron/core/error.h"
#include "megatron/core/rng.h"

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

std::vector<int64_t> sequence_lengths_of(const IndexedDataset& data, SequenceRange range) {
  MEGATRON_CHECK(range.begin >= 0 && range.begin <= range.end && range.end <= data.num_sequences(),
                 "sequence range [" << range.begin << ", " << range.end << ") is outside " << data.prefix() << " with "
                                    << data.num_sequences() << " sequences");
  std::vector<int64_t> lengths;
  lengths.reserve(size_t(range.end - range.begin));
  for (int64_t i = range.begin; i < range.end; ++i) lengths.push_back(data.sequence_length(i));
  return lengths;
}

SequenceRange mock_range(Split split) {
  const std::optional<SequenceRange> range = split_range(parse_split("1,1,1"), split, MockGPTDataset::kNumDocuments);
  return *range;  // all three weights are non-zero
}

// Lengths of the mock split's documents: the whole table is drawn, then the split's slice taken,
// so each split sees the same documents it would in a run building all three.
std::vector<int64_t> mock_lengths(Split split) {
  HostRng rng(0);
  std::vector<int64_t> all(size_t(MockGPTDataset::kNumDocuments));
  for (int64_t& length : all) length = 1 + int64_t(rng.uniform_int(uint64_t(MockGPTDataset::kMaxDocumentLength)));
  const SequenceRange range = mock_range(split);
  return {all.begin() + range.begin, all.begin() + range.end};
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
  double sum = 0.0;
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

std::optional<SequenceRange> split_range(const SplitMatrix& matrix, Split split, int64_t num_sequences) {
  MEGATRON_CHECK(num_sequences >= 0, "negative sequence count " << num_sequences);
  const auto& bookends = matrix[size_t(split)];
  if (!bookends) return std::nullopt;
  // Python's round() on the float64 product: half to even, which nearbyint does by default.
  const double n = double(num_sequences);
  return SequenceRange{int64_t(std::nearbyint(bookends->first * n)), int64_t(std::nearbyint(bookends->second * n))};
}

// ---- ConcatenatedSamples --------------------------------------------------------------------

ConcatenatedSamples::ConcatenatedSamples(const std::vector<int64_t>& document_lengths, int64_t seq_length,
                                         uint64_t seed, int64_t num_samples, const std::string& what)
    : seq_length_(seq_length) {
  MEGATRON_CHECK(seq_length >= 1, "--seq-length must be at least 1, got " << seq_length);
  MEGATRON_CHECK(num_samples >= 0,
                 "requested sample count " << num_samples << " for " << what << " must be non-negative");
  starts_.resize(document_lengths.size() + 1);
  starts_[0] = 0;
  std::partial_sum(document_lengths.begin(), document_lengths.end(), starts_.begin() + 1);
  const int64_t tokens = starts_.back();
  // Sample k reads stream[k*S, k*S + S]: the last full sample needs k*S + S + 1 <= T.
  const int64_t per_epoch = tokens > 0 ? (tokens - 1) / seq_length : 0;
  MEGATRON_CHECK(per_epoch > 0, what << " holds " << tokens << " tokens but one sample needs --seq-length + 1 = "
                                     << seq_length + 1 << "; use more data, a shorter --seq-length or a --split "
                                     << "that gives this split more sequences");
  order_.resize(size_t(per_epoch));
  std::iota(order_.begin(), order_.end(), int64_t(0));
  HostRng rng(seed);
  rng.shuffle(order_.begin(), order_.end());
  num_epochs_ = std::max<int64_t>(1, (num_samples + per_epoch - 1) / per_epoch);
}

Sample ConcatenatedSamples::get(int64_t index) const {
  MEGATRON_CHECK(index >= 0 && index < size(), "sample " << index << " out of range [0, " << size() << ")");
  int64_t position = order_[size_t(index % samples_per_epoch())] * seq_length_;
  Sample sample;
  sample.tokens.resize(size_t(seq_length_ + 1));
  // The last document starting at or before `position`; empty documents share its start and
  // are skipped by taking the last of equal starts.
  int64_t document = std::upper_bound(starts_.begin(), starts_.end(), position) - starts_.begin() - 1;
  int64_t filled = 0;
  while (filled < seq_length_ + 1) {
    const int64_t offset = position - starts_[size_t(document)];
    const int64_t take = std::min(starts_[size_t(document) + 1] - position, seq_length_ + 1 - filled);
    if (take > 0) read_document(document, offset, take, sample.tokens.data() + filled);
    filled += take;
    position += take;
    ++document;
  }
  return sample;
}

// ---- GPTDataset -----------------------------------------------------------------------------

GPTDataset::GPTDataset(IndexedDataset data, SequenceRange range, int64_t seq_length, uint64_t seed, int64_t num_samples)
    : ConcatenatedSamples(
          sequence_lengths_of(data, range), seq_length, seed, num_samples,
          "sequences [" + std::to_string(range.begin) + ", " + std::to_string(range.end) + ") of " + data.prefix()),
      data_(std::move(data)),
      range_(range) {}

void GPTDataset::read_document(int64_t document, int64_t offset, int64_t length, int32_t* out) const {
  data_.read(range_.begin + document, offset, length, out);
}

// ---- MockGPTDataset -------------------------------------------------------------------------

MockGPTDataset::MockGPTDataset(int64_t vocab_size, int64_t seq_length, uint64_t seed, int64_t num_samples, Split split)
    : ConcatenatedSamples(mock_lengths(split), seq_length, seed, num_samples,
                          std::string("split ") + split_name(split) + " of the mock data"),
      vocab_size_(vocab_size) {
  MEGATRON_CHECK(vocab_size >= 2, "mock data needs --vocab-size of at least 2 (one id plus EOD), got " << vocab_size);
}

void MockGPTDataset::read_document(int64_t document, int64_t offset, int64_t length, int32_t* out) const {
  const int64_t eod_position = document_length(document) - 1;
  for (int64_t k = offset; k < offset + length; ++k) {
    out[k - offset] = int32_t(k == eod_position ? vocab_size_ - 1 : (k + 1) % vocab_size_);
  }
}

// ---- building and batching ------------------------------------------------------------------

std::unique_ptr<SampleSource> build_split_dataset(const std::vector<std::string>& data_path, const std::string& split,
                                                  int split_index, int64_t seq_length, uint64_t seed,
                                                  int64_t num_samples) {
  MEGATRON_CHECK(split_index >= 0 && split_index <= 2,
                 "split index " << split_index << " must be 0 (train), 1 (valid) or 2 (test)");
  const Split which = Split(split_index);
  MEGATRON_CHECK(!data_path.empty(), "--data-path is empty; give a dataset prefix or use --mock-data");
  if (data_path.size() > 1) {
    std::string given;
    for (const std::string& item : data_path) given += (given.empty() ? "" : " ") + item;
    MEGATRON_FAIL("--data-path '" << given << "' lists several datasets or weights: blending arrives with the data "
                                  << "pipeline issue; give a single prefix for now");
  }
  const SplitMatrix matrix = parse_split(split);
  IndexedDataset data = IndexedDataset::open(data_path[0]);
  const std::optional<SequenceRange> range = split_range(matrix, which, data.num_sequences());
  if (!range) return nullptr;
  MEGATRON_CHECK(range->end > range->begin, "split " << split_name(which) << " of " << data.prefix()
                                                     << " gets no sequences: --split '" << split << "' maps it to ["
                                                     << range->begin << ", " << range->end << ") of "
                                                     << data.num_sequences() << "; use more data or change --split");
  return std::make_unique<GPTDataset>(std::move(data), *range, seq_length, seed, num_samples);
}

Batch make_batch(const SampleSource& source, const std::vector<int64_t>& sample_indices, int32_t eod,
                 bool eod_mask_loss) {
  MEGATRON_CHECK(!sample_indices.empty(), "make_batch needs at least one sample index");
  const int64_t b = int64_t(sample_indices.size());
  int64_t s = -1;
  Batch batch;
  for (int64_t row = 0; row < b; ++row) {
    const Sample sample = source.get(sample_indices[size_t(row)]);
    if (s < 0) {
      s = int64_t(sample.tokens.size()) - 1;
      MEGATRON_CHECK(s >= 1, "sample " << sample_indices[0] << " has " << sample.tokens.size()
                                       << " tokens; a training sample needs at least 2");
      batch.tokens = Tensor::empty({b, s}, DType::i32);
      batch.labels = Tensor::empty({b, s}, DType::i32);
      batch.loss_mask = Tensor::empty({b, s}, DType::f32);
    }
    MEGATRON_CHECK(int64_t(sample.tokens.size()) == s + 1, "sample " << sample_indices[size_t(row)] << " has "
                                                                     << sample.tokens.size() << " tokens but sample "
                                                                     << sample_indices[0] << " has " << s + 1);
    int32_t* tokens = batch.tokens.data<int32_t>() + row * s;
    int32_t* labels = batch.labels.data<int32_t>() + row * s;
    float* mask = batch.loss_mask.data<float>() + row * s;
    for (int64_t t = 0; t < s; ++t) {
      tokens[t] = sample.tokens[size_t(t)];
      labels[t] = sample.tokens[size_t(t) + 1];
      mask[t] = eod_mask_loss && tokens[t] == eod ? 0.0f : 1.0f;
    }
  }
  return batch;
}

}  // namespace megatron::datasets
